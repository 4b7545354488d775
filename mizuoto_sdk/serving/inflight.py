"""The requests in flight on one replica: each one's channel, and the count routing reads.

A request counts from when routing reserves its replica until its caller is done with it
(``finish``), so a stream paused between chunks still counts. Worker replicas and agent sessions
keep their requests the same way; each passes the lock that also guards its own state, so that a
request is never added after a failure has taken the ones in flight.

A request's own cancel and timeout are seen here too (``stops_due``), so that its replica can
free the caller whatever the other side does: a request stopped that still waits for its answer
past a bound (``unanswered``) fails its replica, and its caller gets ``stop_error``.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING

from mizuoto_sdk.errors import CancelledError, EngineError, OperationTimeoutError

if TYPE_CHECKING:
    from mizuoto_sdk.frames import Frame
    from mizuoto_sdk.request import EngineRequest


class Pending:
    """One request on its replica: the frames that answer it, or the failure that ended it."""

    def __init__(self, request_id: int, request: EngineRequest, capability: str) -> None:
        self.id = request_id
        self.request = request
        self.capability = capability
        self.frames: queue.SimpleQueue[Frame | EngineError] = queue.SimpleQueue()
        # A stream's chunks: how many arrived, and the last index the worker may compute (the
        # caller asked for chunk k: up to k + 1). The worker is working when it may go on.
        self.received = 0
        self.allowed = 1
        self.busy_since: float | None = None  # when the worker began the answer it owes
        self.cancel_sent = False
        self.opened = self.asked = time.monotonic()  # asked: when the caller last asked for more
        self.stopped: float | None = None  # when its cancel or timeout was first seen here
        self.timed_out = False
        self.answered = False  # its last frame (end, result, error) has arrived

    @property
    def owed(self) -> bool:
        """Whether the other side owes an answer now (a stream the caller has not asked for
        more of owes nothing)."""
        return not self.answered and self.received <= self.allowed

    def stop_error(self, why: str) -> EngineError:
        """What the caller gets when its stopped request is ended here, not by the other side."""
        if self.timed_out:
            timeout = self.request.timeout
            return OperationTimeoutError(
                f"ran past its timeout of {timeout:g} s; {why}",
                {"reason": "timeout", "timeout": timeout},
            )
        return CancelledError(f"cancelled; {why}", {"reason": "cancelled"})

    def next_frame(self) -> Frame:
        """The next answer, calling the request's progress callback on the way; raises the
        failure that ended the request (its replica failed or closed)."""
        while True:
            item = self.frames.get()
            if isinstance(item, EngineError):
                self.frames.put(item)  # every later read sees the same end
                raise item
            if item.kind == "progress":
                if self.request.progress is not None:
                    header = item.header
                    self.request.progress(
                        header["done"], header.get("total"), header.get("message")
                    )
                continue
            return item


class InFlight:
    """A replica's requests by id, under the replica's own lock."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._pending: dict[int, Pending] = {}
        self._ids = 0
        self._reserved = 0

    @property
    def count(self) -> int:
        """Requests reserved and not finished (what routing compares)."""
        return self._reserved

    def reserve(self) -> None:
        with self._lock:
            self._reserved += 1

    def release(self) -> None:
        with self._lock:
            self._reserved -= 1

    def add(self, request: EngineRequest, capability: str) -> Pending:
        """A new request's channel (call it holding the lock, after checking the replica can
        take it)."""
        with self._lock:
            self._ids += 1
            pending = Pending(self._ids, request, capability)
            self._pending[pending.id] = pending
            return pending

    def get(self, request_id: object) -> Pending | None:
        with self._lock:
            return self._pending.get(request_id) if isinstance(request_id, int) else None

    def has(self, pending: Pending) -> bool:
        with self._lock:
            return pending.id in self._pending

    def finish(self, pending: Pending) -> None:
        with self._lock:
            self._pending.pop(pending.id, None)
            self._reserved -= 1

    def all(self) -> list[Pending]:
        with self._lock:
            return list(self._pending.values())

    def take_all(self) -> list[Pending]:
        """Every request in flight, forgotten here (their replica failed or closed)."""
        with self._lock:
            taken, self._pending = list(self._pending.values()), {}
            return taken

    def cancels_due(self, pending: list[Pending]) -> list[Pending]:
        """Those of ``pending`` whose caller cancelled since the last look (marked sent)."""
        due = [p for p in pending if p.request.cancel_event.is_set() and not p.cancel_sent]
        for item in due:
            item.cancel_sent = True
        self.stops_due(pending)
        return due

    def stops_due(self, pending: list[Pending]) -> None:
        """Note when each of ``pending`` was cancelled or ran past its own timeout."""
        now = time.monotonic()
        for item in pending:
            if item.stopped is not None:
                continue
            timeout = item.request.timeout
            if item.request.cancel_event.is_set():
                item.stopped = now
            elif timeout is not None and now >= item.opened + timeout:
                item.stopped, item.timed_out = now, True

    def unanswered(self, pending: list[Pending], grace: float) -> list[Pending]:
        """Those of ``pending`` stopped ``grace`` seconds ago or more (counted from when the
        answer became owed, for a stream the caller had paused) whose answer has not come."""
        now = time.monotonic()
        return [
            p
            for p in pending
            if p.stopped is not None and p.owed and now >= max(p.stopped, p.asked) + grace
        ]
