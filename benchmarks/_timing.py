"""What the benchmark scripts share: turns of timed calls, and this process's memory.

Imported by its name (``from _timing import ...``): a script's own folder is on ``sys.path``
when Python runs it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def _nothing() -> None:
    pass


def alternating_best(
    ours: Callable[[], object],
    theirs: Callable[[], object],
    repeats: int,
    sync: Callable[[], None] = _nothing,
) -> tuple[float, float]:
    """Best wall time of each, measured in turns after one warm-up call each; ``sync`` waits for
    the device (``torch.cuda.synchronize``) before a clock is read."""
    ours(), theirs()
    sync()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for function, kept in ((ours, times[0]), (theirs, times[1])):
            start = time.perf_counter()
            function()
            sync()
            kept.append(time.perf_counter() - start)
    return min(times[0]), min(times[1])


def status_mib(field: str) -> float:
    """``VmRSS`` (resident now) or ``VmHWM`` (its peak) of this process, in MiB. Not
    ``ru_maxrss``: Linux carries that over exec from the parent that forked the child."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")
