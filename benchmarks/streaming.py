"""Decode speed with half of a QwenDecoder's layers streamed, against the same model resident.

A random Qwen3 decoder (init_random, no checkpoint) is decoded greedily from a 16-token prompt
twice per repeat, alternating:

- resident: every layer on the device;
- streamed: the memory manager is given room for the base, half of the layers and two staging
  slots, so the other half stays in host memory and is copied in, one layer ahead, every step.

On the CPU the device is simulated (``DeviceService(simulate=...)``): host and "device" are both
CPU memory, so the ratio is the cost of the bookkeeping and of copying half the weights each
step. On a CUDA device the copies are real (pinned host memory, a side stream, events); the
target there is streamed / resident <= 1.5. Decode time per token is (t(N) - t(1)) / (N - 1)
from the best of the repeats of whole generate calls, so prefill and placement cancel out. Both
outputs are asserted equal bit for bit. The bound line gives the time one step needs just to
copy the streamed bytes at the measured host-to-device bandwidth: where it exceeds the resident
step, no prefetch can hide the copies and the ratio is set by the link, not by the code.

``--trace`` also prints one forced out-of-memory retry from the manager's trace: a phase whose
working memory does not fit beside the resident model fails, idle models are released, and the
phase is re-run with more layers streamed.

    python benchmarks/streaming.py [--repeats 5] [--tokens 64] [--device cuda] [--trace]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.lm import QwenConfig, QwenDecoder, generate
from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.memory.stream import stage_bytes
from mizuoto_runtime.ops import init_random
from mizuoto_runtime.runtime import Runtime

CONFIG = {
    "model_type": "qwen3",
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "max_position_embeddings": 1024,
}


def build(device: torch.device, layers: int = CONFIG["num_hidden_layers"]) -> QwenDecoder:
    config = QwenConfig.from_dict(dict(CONFIG, num_hidden_layers=layers))
    return init_random(QwenDecoder(config), torch.Generator().manual_seed(0)).to(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_to_device_bandwidth(device: torch.device, repeats: int = 5) -> float:
    """Bytes per second copied from pinned host memory to ``device`` (best of ``repeats``)."""
    if device.type != "cuda":
        return float("nan")
    source = torch.ones(64 * 2**20, pin_memory=True)  # 256 MiB
    target = torch.empty_like(source, device=device)
    best = float("inf")
    for _ in range(repeats + 1):
        sync(device)
        start = time.perf_counter()
        target.copy_(source, non_blocking=True)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return source.nbytes / best


def step_times(runs: dict[str, Callable[[int], object]], tokens: int, repeats: int, device):
    """Seconds per decode step of each run, measured alternately (best of ``repeats``)."""
    full = {name: float("inf") for name in runs}
    one = dict(full)
    for _ in range(repeats):
        for name, run in runs.items():
            for new, best in ((tokens, full), (1, one)):
                sync(device)
                start = time.perf_counter()
                run(new)
                sync(device)
                best[name] = min(best[name], time.perf_counter() - start)
    return {name: max(full[name] - one[name], 1e-9) / (tokens - 1) for name in runs}


def streaming_setup(model: QwenDecoder, device: torch.device):
    """A manager that must stream half of ``model``'s layers, and the working bytes to pass."""
    where = str(device) if device.type == "cpu" else f"cuda:{device.index or 0}"
    probe = ModelHandle(model, name="bench:decoder", load_device=where, kind="sequence")
    unit = probe.unit_parts[0]
    half = len(probe.unit_parts) // 2
    room = probe.base.nbytes + half * unit.nbytes + 2 * stage_bytes(unit) + 1024
    if device.type == "cpu":
        rt, working = Runtime(simulate={"cpu": room}), 0
    else:
        rt = Runtime()
        free, _ = rt.devices.memory(where)
        working = free + probe.resident_bytes - rt.manager.policy(where).headroom - room
    rt.manager.register([probe], owner=f"bench@{where}")
    return rt, probe, working


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--trace", action="store_true", help="print a forced-OOM retry trace")
    args = parser.parse_args()
    device = torch.device(args.device)
    model, copy = build(device), build(device)  # the same weights, resident and streamed
    ids = torch.randint(
        1, CONFIG["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(1)
    )
    ids = ids.to(device)
    rt, handle, working = streaming_setup(copy, device)

    def resident(new: int):
        return generate(model, ids, max_new_tokens=new)

    def streamed(new: int):
        with rt.manager.use(handle, phase="decode", working_bytes=working):
            return generate(copy, ids, max_new_tokens=new)

    expected = resident(args.tokens)
    result = streamed(args.tokens)
    assert torch.equal(result.tokens, expected.tokens), "streaming must not change the output"
    layers = len(handle.unit_parts)
    streamed_layers = sum(p.state == "streamed" for p in handle.unit_parts)
    times = step_times(
        {"resident": resident, "streamed": streamed}, args.tokens, args.repeats, device
    )
    ratio = times["streamed"] / times["resident"]
    simulated = " (simulated device: copies between CPU tensors)" if device.type == "cpu" else ""
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}{simulated}"
    )
    print(
        f"model: {handle.size_bytes / 1e6:.1f} MB, {layers} layers of "
        f"{handle.unit_parts[0].nbytes / 1e6:.2f} MB; streamed {streamed_layers}/{layers} "
        f"({handle.streamed_bytes / 1e6:.1f} MB per step), tokens equal: yes\n"
    )
    print(f"{'mode':9} {'ms/token':>9} {'tokens/s':>9}")
    for name, seconds in times.items():
        print(f"{name:9} {seconds * 1e3:9.3f} {1 / seconds:9.1f}")
    target = (
        "" if device.type == "cpu" else f" (target <= 1.5: {'met' if ratio <= 1.5 else 'missed'})"
    )
    print(f"streamed / resident: {ratio:.2f}x{target}")
    bandwidth = host_to_device_bandwidth(device)
    if device.type == "cuda":
        bound = handle.streamed_bytes / bandwidth
        print(
            f"bound: {handle.streamed_bytes / 1e6:.1f} MB per step at {bandwidth / 1e9:.1f} GB/s "
            f"host-to-device = {bound * 1e3:.3f} ms/token of copies, resident step "
            f"{times['resident'] * 1e3:.3f} ms"
        )
    if args.trace:
        print_trace()


def print_trace() -> None:
    """One forced out-of-memory retry on a simulated device, as the manager recorded it."""
    model, idle = build(torch.device("cpu"), layers=4), build(torch.device("cpu"), layers=2)
    handle = ModelHandle(model, name="bench:decoder", load_device="cpu", kind="sequence")
    other = ModelHandle(idle, name="idle:decoder", load_device="cpu", kind="sequence")
    unit = handle.unit_parts[0].nbytes
    rt = Runtime(simulate={"cpu": handle.size_bytes + other.size_bytes + unit})
    rt.manager.register([other], owner="idle@cpu")
    rt.manager.register([handle], owner="bench@cpu")
    ids = torch.randint(
        1, CONFIG["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(1)
    )
    activations = other.size_bytes + 2 * unit  # more than is free beside both models

    def phase() -> torch.Tensor:
        rt.devices.meter("cpu").charge(activations)  # what the phase allocates on the device
        try:
            return generate(model, ids, max_new_tokens=4).tokens
        finally:
            rt.devices.meter("cpu").charge(-activations)

    ctx = RequestContext(seed=0, manager=rt.manager)
    with ctx.bind():
        tokens = ctx.run("generate", phase, handles=[handle], working_bytes=0)
    print(f"\nforced out-of-memory retry (simulated {rt.devices.memory('cpu')[1]} B device):")
    for event in rt.manager.trace:
        detail = ", ".join(f"{k}={v}" for k, v in event.items() if k != "event")
        print(f"  {event['event']:8} {detail}")
    print(f"  result   {tokens.shape[1] - ids.shape[1]} new tokens, {handle!r}")


if __name__ == "__main__":
    main()
