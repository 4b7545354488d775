"""A check that runs past its time fails with every thread's stack instead of hanging the run;
a child that dies of a signal is described by the signal and the stacks ``faulthandler`` wrote.

In the suite's own process the deadline is a ``SIGALRM`` timer (main thread, POSIX): its handler
takes the stacks and raises ``CheckTimeout`` into the check, which a blocked ``Lock.acquire`` or
``Thread.join`` lets through. Threads the engine deadlocked stay blocked (the suite's are daemons)
and the run goes on. The handler fires again every few seconds until the check gives up, so that
clean-up blocked on the same lock cannot hang the run either. Elsewhere (another thread, Windows)
there is no deadline here; the checks that can hang or crash run in a child (``childcheck``),
which ``faulthandler`` ends on time.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from types import FrameType

DEFAULT_CHECK_TIMEOUT = 120.0
_AGAIN_SECONDS = 5.0
_STACK_LINES = 80
# Frames every thread of a child shows, which say nothing about the engine.
_NOISE = ('/threading.py"', "<frozen runpy>")


class CheckTimeout(BaseException):
    """Raised into a check that ran past its deadline (a BaseException, so that an engine's or
    check's ``except Exception`` does not swallow it)."""

    def __init__(self, seconds: float, stacks: str) -> None:
        super().__init__(f"still running after {seconds:g} s")
        self.seconds = seconds
        self.stacks = stacks


def thread_stacks() -> str:
    """Every thread's Python stack, most recent call last, named as ``threading`` names it."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        lines = "".join(traceback.format_stack(frame)).rstrip()
        parts.append(f"thread {names.get(ident, '?')} ({ident}):\n{lines}")
    return "\n".join(parts)


def _armable() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Raise ``CheckTimeout`` into the body once it has run ``seconds`` (None: no deadline)."""
    if seconds is None or seconds <= 0 or not _armable():
        yield
        return
    fired: list[CheckTimeout] = []

    def expire(signum: int, frame: FrameType | None) -> None:
        if not fired:
            fired.append(CheckTimeout(seconds, thread_stacks()))
        raise fired[0]

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, _AGAIN_SECONDS)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def faulthandler_stacks(stderr: str) -> str:
    """The stacks ``faulthandler`` wrote to a child's stderr (from its ``Fatal ...`` or
    ``Timeout ...`` line), without the frames of ``threading`` and ``runpy``."""
    lines = [line for line in stderr.strip().splitlines() if not any(n in line for n in _NOISE)]
    start = next((i for i, line in enumerate(lines) if line.startswith(("Fatal", "Timeout"))), 0)
    kept = lines[start : start + _STACK_LINES]
    more = len(lines) - start - len(kept)
    return "\n".join(kept) + (f"\n... ({more} more lines)" if more > 0 else "")


def died(code: int, stderr: str) -> str:
    """How a child that ended with ``code`` (negative: killed by that signal) ended, with the
    stacks ``faulthandler`` wrote to its stderr."""
    if code >= 0:
        return f"the process exited with code {code}"
    try:
        name = f" {signal.Signals(-code).name}"
    except ValueError:
        name = ""
    return (
        f"the process died of signal {-code}{name}; every thread's stack (faulthandler):\n"
        + faulthandler_stacks(stderr)
    )
