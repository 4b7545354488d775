"""Stopping a stream while it works: a cancel or a timeout, during a step or between steps.

A worker thread pulls the stream's chunks one request at a time, so that the check can cancel
while the engine is busy in a step (a long step that never reaches ``ctx.check_cancel()`` shows
as the time it kept running) and can tell a chunk that finishes the step under way from one that
starts after the cancel. Every wait is bounded: a stream that does not stop is reported, not
waited for.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Literal

import attrs

from mizuoto_contract.subject import SEED
from mizuoto_sdk import CancelledError, OperationTimeoutError
from mizuoto_sdk.host import EngineRequest

if TYPE_CHECKING:
    from mizuoto_contract.subject import Subject
    from mizuoto_runtime.context import RequestContext
    from mizuoto_sdk.host import LocalModel

# After a cancel or a timeout the call ends within this many seconds (documented).
STOP_BOUND_SECONDS = 2.0
# A first step still running after this long is interrupted while busy.
BUSY_SECONDS = 0.1
_GRACE_SECONDS = 1.0
_HOST_TRIES = 3

Outcome = Literal["cancelled", "timeout", "error", "finished", "another_chunk", "slow", "hung"]


@attrs.frozen
class Interrupted:
    """How a stream answered a stop: ``outcome``, seconds from the stop to the end, when it
    happened (``busy``: during a step; else between chunks), the chunks before the stop, and
    the exception it ended with."""

    outcome: Outcome
    seconds: float
    busy: bool
    chunks_before: int
    error: BaseException | None = None

    def describe(self) -> str:
        when = "during a step" if self.busy else f"after chunk {self.chunks_before}"
        what = {
            "cancelled": "CancelledError",
            "timeout": "OperationTimeoutError",
            "error": f"{type(self.error).__name__}: {self.error}",
            "finished": "the stream ran to its end",
            "another_chunk": "another chunk from the next step",
            "slow": "the stream went on",
            "hung": "the stream still running",
        }[self.outcome]
        return f"{what} {self.seconds:.2f} s after a stop {when}"


class _Puller:
    """Runs ``next(stream)`` (or ``close``) on its own thread, one request at a time."""

    def __init__(self, step: Callable[[Callable[[], object]], object]) -> None:
        self._step = step
        self._requests: queue.Queue[Callable[[], object] | None] = queue.Queue()
        self._results: queue.Queue[tuple[str, object]] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="mizuoto-contract-pull", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self._requests.get()) is not None:
            try:
                self._results.put(("chunk", self._step(job)))
            except StopIteration:
                self._results.put(("end", None))
            except BaseException as error:
                self._results.put(("error", error))

    def ask(self, job: Callable[[], object]) -> None:
        self._requests.put(job)

    def wait(self, seconds: float) -> tuple[str, object] | None:
        try:
            return self._results.get(timeout=max(seconds, 0.0))
        except queue.Empty:
            return None

    def finish(self, close: Callable[[], object] | None) -> None:
        """Close the stream on the worker (unless it hangs) and let the worker end."""
        if close is not None:
            self.ask(close)
            self.wait(STOP_BOUND_SECONDS)
        self._requests.put(None)
        self.thread.join(timeout=STOP_BOUND_SECONDS)


def _interrupt(
    stream: Iterator[object],
    step: Callable[[Callable[[], object]], object],
    stop: Callable[[], None],
    allow_extra_chunks: bool,
    latency: float = 0.0,
) -> Interrupted:
    puller = _Puller(step)
    hung = False

    def pull() -> object:
        return next(stream)

    try:
        puller.ask(pull)
        first = puller.wait(BUSY_SECONDS)
        busy = first is None
        chunks = 0
        if first is not None:
            kind, value = first
            if kind != "chunk":
                # Ended before any stop: nothing was interrupted.
                error = value if kind == "error" else None
                return Interrupted(_kind(kind, error), 0.0, False, 0, error)  # type: ignore[arg-type]  # an error when kind is 'error'
            chunks = 1
        stop()
        stopped = time.perf_counter()
        if not busy:
            # A stop forwarded by a watcher reaches the engine after ``latency``; the caller
            # asks for the next chunk once it can have arrived.
            time.sleep(latency)
            puller.ask(pull)
        step_under_way = busy
        while True:
            left = STOP_BOUND_SECONDS + _GRACE_SECONDS - (time.perf_counter() - stopped)
            answer = puller.wait(left)
            seconds = time.perf_counter() - stopped
            if answer is None:
                hung = True
                return Interrupted("hung", seconds, busy, chunks)
            kind, value = answer
            if kind == "chunk":
                if seconds > STOP_BOUND_SECONDS:
                    return Interrupted("slow", seconds, busy, chunks)
                if not step_under_way and not allow_extra_chunks:
                    return Interrupted("another_chunk", seconds, busy, chunks)
                step_under_way = False
                puller.ask(pull)
                continue
            error = value if kind == "error" else None
            outcome = _kind(kind, error)  # type: ignore[arg-type]  # as above
            if seconds > STOP_BOUND_SECONDS:
                outcome = "slow"
            return Interrupted(outcome, seconds, busy, chunks, error)  # type: ignore[arg-type]  # as above
    finally:
        close = getattr(stream, "close", None)
        puller.finish(None if hung else close)


def _kind(kind: str, error: BaseException | None) -> Outcome:
    if kind == "end":
        return "finished"
    if isinstance(error, OperationTimeoutError):
        return "timeout"
    if isinstance(error, CancelledError):
        return "cancelled"
    return "error"


def interrupt_engine(
    subject: Subject, handle: LocalModel, ctx: RequestContext, reason: str
) -> Interrupted:
    """Stop the engine's own stream of the long text (no host in between) with
    ``ctx.cancel(reason)``."""
    stream = subject.engine_stream(handle, ctx, text=subject.long_text(handle))

    def step(job: Callable[[], object]) -> object:
        with subject.direct(ctx):
            return job()

    return _interrupt(iter(stream), step, lambda: ctx.cancel(reason), allow_extra_chunks=False)  # type: ignore[call-overload]  # the engine's stream


def interrupt_host(subject: Subject, handle: LocalModel, text: str | None = None) -> Interrupted:
    """Cancel a seeded stream of ``text`` (default: the long text) through the host (the
    request's cancel).

    The host forwards a cancel to the engine within its watch interval, so a chunk or two may
    still arrive after it; the stream must end in CancelledError within the bound. A stream that
    ran to its end before the cancel was forwarded (a busy machine) is tried again.
    """
    from mizuoto_sdk.host.calls import WATCH_INTERVAL

    for _ in range(_HOST_TRIES):
        request = EngineRequest(params={"seed": SEED})
        stream = subject.stream(
            handle, request, subject.long_text(handle) if text is None else text
        )
        seen = _interrupt(
            stream, lambda job: job(), request.cancel, True, latency=5 * WATCH_INTERVAL
        )
        if seen.outcome != "finished":
            break
    return seen
