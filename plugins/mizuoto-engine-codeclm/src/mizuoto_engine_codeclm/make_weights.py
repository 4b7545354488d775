"""Make the shipped weights: ``python -m mizuoto_engine_codeclm.make_weights [--out DIR]``.

The model is untrained: its weights are ``init_random`` on a generator seeded from config.json,
then two fixed rescalings (the token embeddings, tied to the output head, so that the first
logits are neither flat nor one-hot; the codec's last layer, for an audible level). The file is
therefore reproducible byte for byte from config.json, which a test checks, and anyone can
regenerate it instead of trusting a binary. Sizes in config.json keep it a few MB.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from mizuoto_engine_codeclm.model import CONFIG_FILE, WEIGHTS_FILE, CodecLM, ModelConfig
from mizuoto_runtime import init_random

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"


def make_state(config: ModelConfig) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, float32 on the CPU, one name per tensor."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(config.init.seed)
    model = CodecLM(config, dtype=torch.float32, device="cpu")
    init_random(model, generator)
    embedding = model.decoder.model.embed_tokens
    assert embedding is not None  # the decoder is built with its embedding
    with torch.no_grad():
        embedding.weight.mul_(config.init.embedding_scale)
        model.codec.post.weight.mul_(config.init.output_gain)
    state: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:  # a tied weight (lm_head = embed_tokens) is stored once
            continue
        seen.add(id(tensor))
        state[name] = tensor.detach().contiguous()
    return state


def write(out_dir: str | Path, config_path: str | Path | None = None) -> Path:
    """Write ``model.safetensors`` for config.json (the package's own by default) into out_dir."""
    config_path = Path(config_path or WEIGHTS_DIR / CONFIG_FILE)
    config = ModelConfig.from_file(config_path)
    out = Path(out_dir) / WEIGHTS_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    # One metadata entry only: safetensors writes several in a per-process random order.
    save_file(make_state(config), str(out), metadata={"format": "pt"})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mizuoto_engine_codeclm.make_weights", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=WEIGHTS_DIR, help="folder to write into")
    parser.add_argument("--config", type=Path, default=None, help="config.json to build from")
    args = parser.parse_args(argv)
    path = write(args.out, args.config)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
