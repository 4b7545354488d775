"""Decode speed of QwenDecoder against transformers' generate, on the same checkpoint and prompt.

Two random Qwen3 checkpoints are written with save_pretrained and loaded by both sides: a tiny one
(~3M parameters, bound by per-step overhead) and a mid one (~150M, bound by memory bandwidth).
Each is decoded greedily from the same 16-token prompt:

- exact: QwenDecoder with default settings (reference attention, dynamic cache), asserted to give
  transformers' tokens bit for bit;
- fast: compute.attention=sdpa, compute.kv_cache=static, and torch.compile for the
  tiny model (where per-step overhead dominates); the table gives the step logits' largest
  difference from exact and whether the tokens still match.

Decode tokens/s is (N - 1) / (t(N) - t(1)) from the best of the repeats of whole generate calls
with N and 1 new tokens, so the prompt's prefill cancels out; both sides are measured the same way
in the same process, alternating, and the ratio is ours / transformers. For the mid model the
bandwidth limit is the measured copy bandwidth (bytes read + written per second, best of several
copies of a 256 MiB tensor) over the weight bytes one token reads; the fraction is tokens/s over
that limit. With a CUDA device (--device cuda) a graphs row compares compute.cuda_graphs with the
same static-cache eager run.

    python benchmarks/decode.py [--repeats 5] [--tiny-tokens 128] [--mid-tokens 32] [--no-mid]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from mizuoto_runtime.accel.compile import compile_module
from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.lm import QwenDecoder, generate
from mizuoto_sdk import ComputeSettings

CONFIGS = {
    "tiny": {
        "vocab_size": 2048,
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
    },
    "mid": {
        "vocab_size": 32768,
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 14,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "head_dim": 64,
    },
}
FAST = ComputeSettings(attention="sdpa", kv_cache="static")


def copy_bandwidth(device: torch.device, repeats: int = 5) -> float:
    """Bytes moved (read + written) per second by a large tensor copy, best of ``repeats``."""
    source = torch.ones(64 * 2**20, device=device)  # 256 MiB of float32
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats + 1):
        sync(device)
        start = time.perf_counter()
        target.copy_(source)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * source.numel() * source.element_size() / best


def read_bandwidth(device: torch.device, repeats: int = 5) -> float:
    """Bytes read per second by a reduction over a 256 MiB tensor, for context."""
    source = torch.ones(64 * 2**20, device=device)
    best = float("inf")
    for _ in range(repeats + 1):
        sync(device)
        start = time.perf_counter()
        source.sum()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return source.numel() * source.element_size() / best


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def checkpoint(name: str, directory: Path) -> Path:
    config = Qwen3Config(**CONFIGS[name], tie_word_embeddings=True, max_position_embeddings=4096)
    with torch.random.fork_rng():
        torch.manual_seed(0)  # allowed: a script of its own, inside fork_rng
        Qwen3ForCausalLM(config).save_pretrained(directory)
    return directory


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every distinct parameter: what one decode step reads (the tied table once)."""
    unique = {id(p): p for p in model.parameters()}
    return sum(p.numel() * p.element_size() for p in unique.values())


def best_time(run: Callable[[], object], device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    run()
    sync(device)
    return time.perf_counter() - start


def decode_rate(runs: dict[str, Callable[[int], object]], tokens: int, repeats: int, device):
    """Decode tokens/s of each run, measured alternately (best of ``repeats``)."""
    full = {name: float("inf") for name in runs}
    one = dict(full)
    for _ in range(repeats):
        for name, run in runs.items():
            full[name] = min(full[name], best_time(lambda run=run: run(tokens), device))
            one[name] = min(one[name], best_time(lambda run=run: run(1), device))
    return {name: (tokens - 1) / max(full[name] - one[name], 1e-9) for name in runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny-tokens", type=int, default=128)
    parser.add_argument("--mid-tokens", type=int, default=32)
    parser.add_argument("--no-mid", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    bandwidth = copy_bandwidth(device)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}")
    print(
        f"copy bandwidth: {bandwidth / 1e9:.1f} GB/s (read + write, STREAM convention); "
        f"read-only (sum): {read_bandwidth(device) / 1e9:.1f} GB/s\n"
    )
    header = (
        f"{'model':5} {'mode':6} {'params':>7} {'transformers':>12} {'ours':>9} {'ratio':>6} "
        f"{'tokens':>7} {'max |dlogit|':>12} {'of bw limit':>11}  notes"
    )
    print(header)
    print("-" * len(header))
    names = ["tiny"] if args.no_mid else ["tiny", "mid"]
    with tempfile.TemporaryDirectory() as scratch:
        for name in names:
            tokens = args.tiny_tokens if name == "tiny" else args.mid_tokens
            repeats = args.repeats if name == "tiny" else max(2, args.repeats // 2)
            bench_model(name, Path(scratch) / name, tokens, repeats, device, bandwidth)


def bench_model(name, directory, tokens, repeats, device, bandwidth) -> None:
    checkpoint(name, directory)
    theirs = Qwen3ForCausalLM.from_pretrained(directory).eval().to(device)
    ours = QwenDecoder.from_pretrained(directory, device=device)
    params = sum(p.numel() for p in {id(p): p for p in ours.parameters()}.values())
    ids = torch.randint(
        1, CONFIGS[name]["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(1)
    )
    ids = ids.to(device)

    def upstream(new: int, logits: bool = False):
        with torch.no_grad():
            return theirs.generate(
                ids,
                max_new_tokens=new,
                do_sample=False,
                disable_compile=True,
                pad_token_id=0,
                return_dict_in_generate=logits,
                output_logits=logits,
            )

    def mine(compute: ComputeSettings, decoder=ours):
        def run(new: int, logits: bool = False):
            ctx = RequestContext(compute=compute)
            with ctx.bind():
                return generate(decoder, ids, max_new_tokens=new, output_logits=logits), ctx

        return run

    exact = mine(ComputeSettings())
    reference = upstream(tokens, logits=True)
    result, _ = exact(tokens, logits=True)
    assert torch.equal(result.tokens, reference.sequences), "exact mode must equal transformers"
    assert all(torch.equal(a, b) for a, b in zip(result.logits, reference.logits, strict=True))

    fast_settings = FAST.replace(compile=name == "tiny")
    # cpp_wrapper: inductor's C++ launcher instead of its Python one, per call, not global
    options = {"cpp_wrapper": True} if device.type == "cpu" else None
    fast_decoder = compile_module(ours, name == "tiny", f"lm.{name}", options=options)
    fast = mine(fast_settings, fast_decoder)
    start = time.perf_counter()
    fast_result, fast_ctx = fast(tokens, logits=True)  # compiles, when compiling
    fast(1)
    warmup = time.perf_counter() - start
    rates = decode_rate(
        {"transformers": upstream, "exact": exact, "fast": fast}, tokens, repeats, device
    )
    diff = (fast_result.logits - result.logits).abs().max().item()
    same = torch.equal(fast_result.tokens, result.tokens)
    limit = bandwidth / weight_bytes(ours)
    rows = [("exact", rates["exact"], 0.0, True, ""), ("fast", rates["fast"], diff, same, "")]
    compiled = fast_ctx.applied.get("compile", {}).get(f"lm.{name}", "eager")
    rows[1] = (*rows[1][:4], f"compile: {compiled}; first call {warmup:.1f}s")
    for mode, rate, delta, equal, note in rows:
        fraction = f"{rate / limit:.2f}" if name == "mid" else "-"
        print(
            f"{name:5} {mode:6} {params / 1e6:6.1f}M {rates['transformers']:9.1f}/s "
            f"{rate:7.1f}/s {rate / rates['transformers']:5.2f}x {verdict(equal):>7} "
            f"{delta:12.3g} {fraction:>11}  {note}"
        )
    if name == "mid":
        print(
            f"{'':5} limit  {bandwidth / 1e9:.1f} GB/s / {weight_bytes(ours) / 1e6:.0f} MB per "
            f"token = {limit:.1f} tokens/s; transformers reaches "
            f"{rates['transformers'] / limit:.2f}"
        )
    if name == "tiny":
        graphs_row(ours, ids, tokens, repeats, device)


def verdict(equal: bool) -> str:
    return "equal" if equal else "differ"


def graphs_row(decoder, ids, tokens, repeats, device) -> None:
    if device.type != "cuda":
        print(f"{'tiny':5} graphs  n/a: CUDA graphs need a CUDA device (this run: {device.type})")
        return
    static = ComputeSettings(kv_cache="static")

    def run(compute: ComputeSettings):
        def call(new: int):
            ctx = RequestContext(compute=compute)
            with ctx.bind():
                return generate(decoder, ids, max_new_tokens=new), ctx

        return call

    eager, graphs = run(static), run(static.replace(cuda_graphs=True))
    (expected, _), (replayed, ctx) = eager(tokens), graphs(tokens)
    assert torch.equal(expected.tokens, replayed.tokens), "graph replay must equal eager"
    rates = decode_rate({"eager": eager, "graphs": graphs}, tokens, repeats, device)
    print(
        f"{'tiny':5} graphs  eager static {rates['eager']:.1f}/s, graphs {rates['graphs']:.1f}/s: "
        f"{rates['graphs'] / rates['eager']:.2f}x ({ctx.applied.get('cuda_graphs')})"
    )


if __name__ == "__main__":
    main()
