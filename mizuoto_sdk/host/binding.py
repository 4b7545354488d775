"""The one process-state change a rank process makes: its thread count and its device.

A worker process of a local deployment, or a process an external launcher started for one rank,
is the host's own, so it may set what an engine never may: torch's thread count (which decides
CPU output bit for bit) and the current CUDA device (which NCCL and the caching allocator use).
"""

from __future__ import annotations


def bind_process(device: str, threads: int | None) -> None:
    """A rank process's own state, set once before its model loads: torch's thread count and
    the CUDA device. Only a worker, or a process an external launcher started for one rank,
    calls it."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
