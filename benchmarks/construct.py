"""Constructing a ~150M-parameter decoder from ops.default against constructing it from torch.nn.

torch.nn initialises every parameter at construction (and advances the global generator);
ops.default allocates and leaves them for the checkpoint. Printed ratios are measured in one run:

    python benchmarks/construct.py [--repeats 3] [--blocks 14]
"""

from __future__ import annotations

import argparse
import gc
import time

import torch
from torch import nn

from mizuoto_runtime import ops


class Block(nn.Module):
    """Pre-norm attention projections and a gated MLP, as in Llama/Qwen (no forward needed)."""

    def __init__(self, layers, width: int, hidden: int, device) -> None:
        super().__init__()
        self.attn_norm = layers.RMSNorm(width, device=device)
        self.q = layers.Linear(width, width, bias=False, device=device)
        self.k = layers.Linear(width, width, bias=False, device=device)
        self.v = layers.Linear(width, width, bias=False, device=device)
        self.o = layers.Linear(width, width, bias=False, device=device)
        self.mlp_norm = layers.RMSNorm(width, device=device)
        self.gate = layers.Linear(width, hidden, bias=False, device=device)
        self.up = layers.Linear(width, hidden, bias=False, device=device)
        self.down = layers.Linear(hidden, width, bias=False, device=device)


class Decoder(nn.Module):
    def __init__(
        self,
        layers=nn,
        *,
        vocab: int = 32000,
        width: int = 768,
        hidden: int = 2048,
        blocks: int = 14,
        device=None,
    ) -> None:
        super().__init__()
        self.embed = layers.Embedding(vocab, width, device=device)
        self.blocks = nn.ModuleList(Block(layers, width, hidden, device) for _ in range(blocks))
        self.norm = layers.RMSNorm(width, device=device)
        self.head = layers.Linear(width, vocab, bias=False, device=device)


def best_of(repeats: int, build) -> tuple[float, bool]:
    """Best wall time of ``build()``, and whether it moved the global CPU generator."""
    times, moved = [], False
    for _ in range(repeats):
        before = torch.get_rng_state()
        gc.collect()
        start = time.perf_counter()
        model = build()
        times.append(time.perf_counter() - start)
        moved |= not torch.equal(before, torch.get_rng_state())
        del model
    return min(times), moved


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=14)
    args = parser.parse_args()
    count = sum(
        p.numel() for p in Decoder(ops.default, blocks=args.blocks, device="meta").parameters()
    )
    variants = {
        "torch.nn, cpu": lambda: Decoder(nn, blocks=args.blocks),
        "ops.default, cpu": lambda: Decoder(ops.default, blocks=args.blocks),
        "torch.nn, meta": lambda: Decoder(nn, blocks=args.blocks, device="meta"),
        "ops.default, meta": lambda: Decoder(ops.default, blocks=args.blocks, device="meta"),
    }
    with torch.random.fork_rng(devices=[]):
        results = {name: best_of(args.repeats, build) for name, build in variants.items()}
    print(
        f"decoder: {count / 1e6:.1f}M parameters ({args.blocks} blocks), "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, best of {args.repeats}"
    )
    peer = results["torch.nn, cpu"][0]
    print(f"{'construction':<20}{'seconds':>10}{'torch.nn cpu / this':>22}{'draws global RNG':>18}")
    for name, (seconds, moved) in results.items():
        print(f"{name:<20}{seconds:>10.4f}{peer / seconds:>22.1f}{'yes' if moved else 'no':>18}")


if __name__ == "__main__":
    main()
