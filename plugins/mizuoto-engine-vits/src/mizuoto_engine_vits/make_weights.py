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
    ``out_dir``: ``TINY`` with ``overrides``, initialised by transformers after a seed that
    ``torch.random.fork_rng`` keeps from the rest of the process."""
    import torch
    from transformers import VitsConfig, VitsModel, VitsTokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = {c: i for i, c in enumerate(characters)}
    config = VitsConfig(vocab_size=len(vocab), **{**TINY, **(overrides or {})})
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = VitsModel(config).eval()
    model.save_pretrained(out)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=2) + "\n")
    settings = {**TOKENIZER, **(tokenizer or {})}
    VitsTokenizer(str(out / "vocab.json"), **settings).save_pretrained(out)
    return out


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
