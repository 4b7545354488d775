"""``mizuoto_runtime.nn`` codecs (EnCodec, Mimi) against transformers' models, in one run.

Both sides load the same ``save_pretrained`` folder of a randomly initialised model at the
published size (``EncodecConfig()`` is facebook/encodec_24khz, ``MimiConfig()`` kyutai/mimi).
Encode and decode run on the same noise, ours and upstream's calls alternating so that both meet
the same machine load; the best of ``--repeats`` is printed as seconds of audio coded per second
(higher is better) with ours / upstream. Peak memory is the resident set size sampled every
millisecond by a thread during one call, above what it was just before (tensors included), after
``malloc_trim`` gave the heap's free pages back so that neither side starts on the other's.

    python benchmarks/nn_codecs.py [--seconds 4] [--repeats 3] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _timing import alternating_best  # benchmarks/ is on sys.path when run as a script

from mizuoto_runtime.nn import load_codec

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * _PAGE


def _trim() -> None:
    """Hand freed heap pages back to the OS (glibc), so a call starts from a clean baseline."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def peak_rss_above_start(function: Callable[[], object]) -> int:
    """Peak resident bytes above the start while ``function`` runs (sampled every ms)."""
    _trim()
    start, peak, done = rss_bytes(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        function()
    finally:
        done.set()
        sampler.join()
    return max(0, max(peak[0], rss_bytes()) - start)


def upstream_models(folder: Path) -> dict[str, tuple[torch.nn.Module, int]]:
    """Each family's random published-size model saved under ``folder``, and its sample rate."""
    from transformers import EncodecConfig, EncodecModel, MimiConfig, MimiModel

    models: dict[str, tuple[torch.nn.Module, int]] = {}
    for name, config, model_class in (
        ("encodec", EncodecConfig(), EncodecModel),
        ("mimi", MimiConfig(), MimiModel),
    ):
        with torch.random.fork_rng():
            torch.manual_seed(0)  # allowed: a script of its own, inside fork_rng
            model = model_class(config).eval()
            with torch.no_grad():
                for key, buffer in model.named_buffers():
                    if key.endswith(("codebook.embed", "embed_sum")):
                        buffer.normal_()
        model.save_pretrained(folder / name)
        models[name] = (model, config.sampling_rate)
    return models


_Pair = tuple[Callable[[], object], Callable[[], object]]


def _calls(name: str, ours: Any, theirs: Any, audio: torch.Tensor) -> dict[str, _Pair]:
    """Encode and decode, ours and upstream's, on the same audio and the same codes."""
    codes = ours.encode(audio)
    if name == "encodec":  # upstream's frames axis (one frame: no chunking) and no scales
        return {
            "encode": (lambda: ours.encode(audio), lambda: theirs.encode(audio)),
            "decode": (lambda: ours.decode(codes), lambda: theirs.decode(codes[None], [None])),
        }
    return {
        "encode": (lambda: ours.encode(audio), lambda: theirs.encode(audio)),
        "decode": (lambda: ours.decode(codes), lambda: theirs.decode(codes)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: as is)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    print(f"torch threads {threads}, {args.seconds:g} s of noise, best of {args.repeats}")
    header = f"{'codec':<8} {'call':<7} {'ours s/s':>10} {'upstream s/s':>13} {'ratio':>7}"
    print(header + f" {'ours peak MiB':>14} {'upstream peak MiB':>18}")
    with tempfile.TemporaryDirectory() as directory, torch.inference_mode():
        for name, (theirs, rate) in upstream_models(Path(directory)).items():
            ours = load_codec(Path(directory) / name)
            audio = torch.randn(
                1, 1, int(args.seconds * rate), generator=torch.Generator().manual_seed(1)
            )
            calls = _calls(name, ours, theirs, audio)
            for call, (mine, upstream) in calls.items():
                best_ours, best_theirs = alternating_best(mine, upstream, args.repeats)
                peak_ours, peak_theirs = peak_rss_above_start(mine), peak_rss_above_start(upstream)
                print(
                    f"{name:<8} {call:<7} {args.seconds / best_ours:>10.2f} "
                    f"{args.seconds / best_theirs:>13.2f} {best_theirs / best_ours:>6.2f}x "
                    f"{peak_ours / 2**20:>14.1f} {peak_theirs / 2**20:>18.1f}"
                )


if __name__ == "__main__":
    main()
