"""Make the shipped ``tiny`` model: ``python -m mizuoto_engine_vits.make_weights [--out DIR]``.

A small random ``VitsModel`` written by transformers' ``save_pretrained`` (transformers is a
development dependency only: the engine never imports it), with a ``VitsTokenizer`` folder for
English characters laid out as MMS-TTS English's (the pad and blank token ``k`` has id 0,
``add_blank``, ``normalize``, no phonemes, no uroman). The weights are untrained, so the audio is
noise; the folder is what a Hub MMS-TTS folder is, smaller. Tests call ``write`` with other
sizes (``overrides``) to check the engine against upstream on several configurations.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"

CHARACTERS = "k abcdefghijlmnopqrstuvwxyz'-"
"""The vocabulary, in id order: ``k`` first (MMS English's pad token, so the blank is 0)."""

TINY: dict[str, Any] = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "ffn_dim": 64,
    "flow_size": 16,
    "spectrogram_bins": 33,
    "upsample_initial_channel": 32,
    "upsample_rates": [8, 8, 2, 2],
    "upsample_kernel_sizes": [16, 16, 4, 4],
    "resblock_kernel_sizes": [3, 5],
    "resblock_dilation_sizes": [[1, 3], [1, 3]],
    "prior_encoder_num_flows": 2,
    "prior_encoder_num_wavenet_layers": 2,
    "posterior_encoder_num_wavenet_layers": 1,
    "duration_predictor_num_flows": 2,
    "duration_predictor_filter_channels": 32,
    "depth_separable_num_layers": 2,
}
"""Sizes of the shipped model (everything else is VitsConfig's default, i.e. MMS-TTS's)."""

TOKENIZER: dict[str, Any] = {
    "add_blank": True,
    "is_uroman": False,
    "language": "eng",
    "normalize": True,
    "phonemize": False,
    "pad_token": "k",
}


def write(
    out_dir: str | Path,
    *,
    seed: int = 0,
    overrides: Mapping[str, Any] | None = None,
    characters: str = CHARACTERS,
    tokenizer: Mapping[str, Any] | None = None,
) -> Path:
    """Write config.json, model.safetensors, vocab.json and tokenizer_config.json into
    ``out_dir``: ``TINY`` with ``overrides``, its weights drawn by ``fill`` from a generator
    seeded ``seed`` (the process's generators are neither read nor advanced)."""
    import torch
    from transformers import VitsConfig, VitsModel, VitsTokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = {c: i for i, c in enumerate(characters)}
    config = VitsConfig(vocab_size=len(vocab), **{**TINY, **(overrides or {})})
    # Built on meta, transformers' own initialisation draws nothing; fill() gives the values.
    with torch.random.fork_rng(), torch.device("meta"):
        model = VitsModel(config)
    model = model.to_empty(device="cpu").eval()
    fill(model, torch.Generator().manual_seed(seed))
    model.save_pretrained(out)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=2) + "\n")
    settings = {**TOKENIZER, **(tokenizer or {})}
    VitsTokenizer(str(out / "vocab.json"), **settings).save_pretrained(out)
    return out


def fill(model: Any, generator: Any) -> None:
    """Random values for every parameter of a transformers ``VitsModel``, from ``generator``:
    matrices and kernels uniform within 1/sqrt(fan-in) (torch.nn's bound), embeddings standard
    normal, layer norms one and zero, every other vector (biases, the duration flows' affine)
    normal with deviation 0.1; each weight-norm magnitude is its direction's norm, so the
    normalised weight is the direction."""
    import torch
    from torch import nn

    with torch.no_grad():
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                if isinstance(module, nn.LayerNorm):
                    param.fill_(1.0 if name == "weight" else 0.0)
                elif isinstance(module, nn.Embedding):
                    param.normal_(generator=generator)
                elif name == "original0":
                    continue  # the magnitude: set from its direction below
                elif param.dim() >= 2:
                    bound = (param.shape[1] * param[0, 0].numel()) ** -0.5
                    param.uniform_(-bound, bound, generator=generator)
                else:
                    param.normal_(0.0, 0.1, generator=generator)
            if hasattr(module, "original0"):  # a weight-norm ParametrizationList
                module.original0.copy_(torch.norm_except_dim(module.original1, 2, 0))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mizuoto_engine_vits.make_weights", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=WEIGHTS_DIR, help="folder to write into")
    args = parser.parse_args(argv)
    path = write(args.out)
    size = sum(f.stat().st_size for f in path.iterdir()) / 1e6
    print(f"wrote {path} ({size:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
