"""The calls a host runs now, so that a stop can end them within a bounded time.

A process that runs engine calls (the CLI, a worker, a rank, the agent, the server) stops by
cancelling every call in flight and waiting a bounded time for them to unwind: an engine's
``check_cancel()`` raises, its ``finally`` blocks run, the children it started with
``ctx.open_process`` are killed as the blocks are left. A stream that sits between two chunks
(its caller has not asked for the next one) runs no engine code that could see the cancel, so
the stop closes its engine generator itself. What has not unwound when the time is up is left to
the process's exit; ``mizuoto_runtime.process.kill_children`` then kills the children left.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

STOP_TIMEOUT = 10.0
"""Seconds a stop waits for the calls in flight to unwind (setting ``host.stop_timeout``)."""


class Stoppable(Protocol):
    """One call in flight (``host.calls.Call`` is one)."""

    @property
    def name(self) -> str: ...

    def stop(self, deadline: float) -> None:
        """Cancel the call; a stream paused between chunks closes its engine generator, waiting
        until ``deadline`` (``time.monotonic()``) at most for a step in progress to end."""

    def wait_unwound(self, timeout: float) -> bool:
        """Whether the engine code of the call has ended within ``timeout`` seconds."""


class OpenCalls:
    """The calls in flight in one host; safe for any number of threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: set[Stoppable] = set()

    def add(self, call: Stoppable) -> None:
        with self._lock:
            self._calls.add(call)

    def discard(self, call: Stoppable) -> None:
        with self._lock:
            self._calls.discard(call)

    def __len__(self) -> int:
        with self._lock:
            return len(self._calls)

    def stop(self, grace: float) -> list[str]:
        """Cancel every call in flight and wait up to ``grace`` seconds for all of them to
        unwind; returns the names of the models whose calls had not unwound by then."""
        deadline = time.monotonic() + max(0.0, grace)
        with self._lock:
            calls = list(self._calls)
        stoppers = [
            threading.Thread(target=call.stop, args=(deadline,), name="mizuoto-stop", daemon=True)
            for call in calls
        ]
        for stopper in stoppers:  # in parallel: one slow step must not eat the others' time
            stopper.start()
        left = [
            call.name
            for call in calls
            if not call.wait_unwound(max(0.0, deadline - time.monotonic()))
        ]
        for stopper in stoppers:
            stopper.join(max(0.0, deadline - time.monotonic()))
        return left
