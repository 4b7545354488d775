"""Loading a ~150M-parameter safetensors checkpoint: load_state_dict + load_into into ops.default,
against safetensors.torch.load_file + load_state_dict into torch.nn, against reading the bytes.

load_into assigns the memory-mapped tensors as parameters, so "loaded" means mapped, not read:
pages are faulted in when a forward first touches them. The table therefore also times a pass
that touches every weight (a sum) right after loading; ``ours + touch`` against ``torch.nn`` (which
has copied every byte) is the like-for-like number. All numbers come from one run, page cache
warm (the file is read once before timing). Each column is its best run; ``ready`` and
``ready+touch`` are the best sums, so they can exceed the sum of the columns. RSS growth shows
whether a path faulted its pages in (for the heap path it also counts memory reused from earlier
repeats as already resident):

    python benchmarks/load.py [--repeats 5] [--blocks 14]
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from pathlib import Path

import safetensors.torch
import torch
from construct import Decoder  # benchmarks/ is on sys.path when this runs as a script
from torch import nn

from mizuoto_runtime import ops
from mizuoto_runtime.weights.loading import load_into, load_state_dict


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def mapping_of(tensor: torch.Tensor) -> str:
    """The file backing ``tensor``'s memory, from /proc/self/maps ("anonymous" if none)."""
    address = tensor.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= address < high:
                return fields[5] if len(fields) > 5 else "anonymous"
    return "unknown"


def touch(model: nn.Module) -> float:
    """Seconds to read every parameter once (a sum each)."""
    start = time.perf_counter()
    with torch.no_grad():
        for param in model.parameters():
            param.sum()
    return time.perf_counter() - start


def ours(path: Path, blocks: int) -> tuple[nn.Module, float, float]:
    start = time.perf_counter()
    model = Decoder(ops.default, blocks=blocks)
    built = time.perf_counter()
    load_into(model, load_state_dict(path))
    return model, built - start, time.perf_counter() - built


def peer_copy(path: Path, blocks: int) -> tuple[nn.Module, float, float]:
    start = time.perf_counter()
    model = Decoder(nn, blocks=blocks)
    built = time.perf_counter()
    model.load_state_dict(safetensors.torch.load_file(path))
    return model, built - start, time.perf_counter() - built


def peer_assign(path: Path, blocks: int) -> tuple[nn.Module, float, float]:
    start = time.perf_counter()
    model = Decoder(nn, blocks=blocks, device="meta")
    built = time.perf_counter()
    model.load_state_dict(safetensors.torch.load_file(path), assign=True)
    return model, built - start, time.perf_counter() - built


def read_bytes(path: Path, buffer: bytearray) -> float:
    start = time.perf_counter()
    view, filled = memoryview(buffer), 0
    with open(path, "rb", buffering=0) as file:
        while filled < len(buffer):
            filled += file.readinto(view[filled:])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=14)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.safetensors"
        source = ops.init_random(Decoder(ops.default, blocks=args.blocks), torch.Generator())
        count = sum(p.numel() for p in source.parameters())
        safetensors.torch.save_file(source.state_dict(), path)
        del source
        size = path.stat().st_size
        buffer = bytearray(size)  # allocated and touched once, outside the timing
        read_bytes(path, buffer)  # warm the page cache

        rows: dict[str, list[tuple[float, float, float]]] = {}
        notes: dict[str, str] = {}
        for name, load in (
            ("ours: ops.default + load_into", ours),
            ("torch.nn + load_state_dict", peer_copy),
            ("torch.nn meta + assign=True", peer_assign),
        ):
            for _ in range(args.repeats):
                gc.collect()
                rss_before = rss_mib()
                model, construct_s, load_s = load(path, args.blocks)
                rss_loaded = rss_mib()
                touch_s = touch(model)
                rss_touched = rss_mib()
                rows.setdefault(name, []).append((construct_s, load_s, touch_s))
                notes[name] = (
                    f"weights in {mapping_of(model.blocks[0].q.weight)}; RSS +"
                    f"{rss_loaded - rss_before:.0f} MiB after load, +"
                    f"{rss_touched - rss_before:.0f} MiB after touch"
                )
                if name.startswith("ours"):
                    reference = safetensors.torch.load_file(path)
                    assert all(torch.equal(v, reference[k]) for k, v in model.state_dict().items())
                    del reference
                del model
        read_s = min(read_bytes(path, buffer) for _ in range(args.repeats))

    print(
        f"checkpoint: {count / 1e6:.1f}M parameters, {size / 2**20:.0f} MiB fp32 safetensors; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, best of {args.repeats}"
    )
    header = f"{'':<32}{'construct':>10}{'load':>9}{'ready':>9}{'touch':>9}{'ready+touch':>13}"
    print(header)
    best: dict[str, tuple[float, float]] = {}
    for name, runs in rows.items():
        construct_s, load_s, touch_s = (min(column) for column in zip(*runs, strict=True))
        ready = min(c + ld for c, ld, _ in runs)
        ready_touched = min(c + ld + t for c, ld, t in runs)
        best[name] = (ready, ready_touched)
        print(
            f"{name:<32}{construct_s:>10.4f}{load_s:>9.4f}{ready:>9.4f}{touch_s:>9.4f}"
            f"{ready_touched:>13.4f}"
        )
    print(f"{'read the bytes (page cache)':<32}{'':>10}{read_s:>9.4f}")
    print()
    for name, note in notes.items():
        print(f"{name}: {note}")
    ours_ready, ours_touched = best["ours: ops.default + load_into"]
    copy_ready, _ = best["torch.nn + load_state_dict"]
    _, assign_touched = best["torch.nn meta + assign=True"]
    print()
    print(f"torch.nn copy ready / ours ready:                {copy_ready / ours_ready:8.1f}x")
    print(f"torch.nn copy ready / ours ready+touch (fair):   {copy_ready / ours_touched:8.1f}x")
    print(f"ours ready+touch / read the bytes:               {ours_touched / read_s:8.2f}x")
    print(f"torch.nn copy ready / read the bytes:            {copy_ready / read_s:8.2f}x")
    print(f"torch.nn assign ready+touch / ours ready+touch:  {assign_touched / ours_touched:8.2f}x")


if __name__ == "__main__":
    main()
