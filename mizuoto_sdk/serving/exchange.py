"""One request's conversation with the replica that took it: a lazy stream, or a call's value.

A stream stays lazy across the process boundary, at most one chunk ahead: once the caller has
asked for chunk ``k`` the worker may compute chunks up to ``k + 1``. The request (sent at the
caller's first ``next()``) asks for chunk 0; each later ``next()`` asks for one more. So the
worker computes the chunk after the one the caller waits for while the caller uses it, and a
worker slower than its caller never waits a round trip between chunks. Closing the stream early
tells the worker to close the engine's generator; a chunk it computed ahead is dropped.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from mizuoto_sdk.errors import EngineError
from mizuoto_sdk.frames import Frame, FrameError, chunk_from_frame, error_from_frame

if TYPE_CHECKING:
    from mizuoto_sdk.errors import WorkerFailed
    from mizuoto_sdk.request import EngineRequest
    from mizuoto_sdk.serving.inflight import Pending
    from mizuoto_sdk.serving.routing import ReplicaStatus
    from mizuoto_sdk.types import AudioChunk


T = TypeVar("T")


class Replica(Protocol):
    """What a handle and its exchanges ask of a replica: ``serving.workers.ProcessReplica``
    (worker processes) and ``remote.client.RemoteReplica`` (an agent elsewhere) are two."""

    id: int
    devices: tuple[str, ...]
    metadata: dict[str, Any]

    @property
    def healthy(self) -> bool: ...

    @property
    def in_flight(self) -> int: ...

    def reserve(self) -> None: ...

    def release(self) -> None: ...

    def status(self) -> ReplicaStatus: ...

    def start(self) -> None: ...

    def open(
        self, header: Mapping[str, object], payload: bytes, request: EngineRequest
    ) -> Pending: ...

    def send(
        self,
        kind: str,
        header: Mapping[str, object],
        payload: bytes = b"",
        *,
        every_rank: bool = False,
    ) -> None: ...

    def ask_next(self, pending: Pending) -> None: ...

    def has_pending(self, pending: Pending) -> bool: ...

    def finish(self, pending: Pending) -> None: ...

    def fail(self, reason: str) -> None: ...

    def failed_error(self, during: str) -> WorkerFailed: ...

    def close(self) -> None: ...


def stream(
    replica: Replica, header: Mapping[str, object], payload: bytes, request: EngineRequest
) -> Generator[AudioChunk, None, None]:
    """The chunks of a streaming request on ``replica`` (already reserved for it)."""
    pending = _open(replica, header, payload, request)  # asks for chunk 0 (and allows 1)
    finished = False
    try:
        while True:
            frame = pending.next_frame()
            if frame.kind == "chunk":
                chunk = _checked(replica, pending, chunk_from_frame, frame)
                yield chunk
                replica.ask_next(pending)  # the caller asks for the next chunk: allow one more
            elif frame.kind in ("end", "error"):
                finished = True
                _write_back(request, frame)
                if frame.kind == "error":
                    raise _checked(replica, pending, error_from_frame, frame)
                return
            else:
                raise _unexpected(replica, pending, frame)
    finally:
        if not finished:
            replica.send("close", {"id": pending.id})
        replica.finish(pending)


def run(
    replica: Replica,
    header: Mapping[str, object],
    payload: bytes,
    request: EngineRequest,
    files: Callable[[Frame], None] | None = None,
) -> Frame:
    """The ``result`` (or ``chunk``, for a collected stream) frame that answers a request.

    ``files``: what to do with each ``file`` frame that comes before the answer (a remote
    ``prepare_voice``); it raises ``FrameError`` or ``ValueError`` for a file it cannot take,
    which fails the replica. Without it a ``file`` frame is unexpected.
    """
    pending = _open(replica, header, payload, request)
    try:
        frame = pending.next_frame()
        while frame.kind == "file" and files is not None:
            _checked(replica, pending, files, frame)
            frame = pending.next_frame()
        if frame.kind == "error":
            _write_back(request, frame)
            raise _checked(replica, pending, error_from_frame, frame)
        if frame.kind == "chunk":  # collect: the whole output, then its end
            end = pending.next_frame()
            if end.kind != "end":
                raise _unexpected(replica, pending, end)
            _write_back(request, end)
            return frame
        if frame.kind != "result":
            raise _unexpected(replica, pending, frame)
        _write_back(request, frame)
        return frame
    finally:
        replica.finish(pending)


def _open(
    replica: Replica, header: Mapping[str, object], payload: bytes, request: EngineRequest
) -> Pending:
    try:
        pending = replica.open(
            {**header, "text_input": request.text_input is not None}, payload, request
        )
    except BaseException:
        replica.release()
        raise
    if request.text_input is not None:
        threading.Thread(
            target=_pump_text, args=(replica, pending, request.text_input), daemon=True
        ).start()
    return pending


def _pump_text(replica: Replica, pending: Pending, source: queue.Queue[str | None]) -> None:
    """Forward the caller's streaming text to the worker until it ends (None) or the call does."""
    while replica.has_pending(pending):
        try:
            text = source.get(timeout=0.05)
        except queue.Empty:
            continue
        replica.send("text", {"id": pending.id, "text": text})
        if text is None:
            return


def _write_back(request: EngineRequest, frame: Frame) -> None:
    header = frame.header
    request.applied.update(header.get("applied") or {})
    request.warnings.extend(header.get("warnings") or [])
    request.timings.update(header.get("timings") or {})


def _checked(replica: Replica, pending: Pending, read: Callable[[Frame], T], frame: Frame) -> T:
    try:
        return read(frame)
    except (FrameError, TypeError, ValueError) as error:
        replica.fail(f"a malformed {frame.kind} frame ({error})")
        raise replica.failed_error(pending.capability) from None


def _unexpected(replica: Replica, pending: Pending, frame: Frame) -> EngineError:
    replica.fail(f"an unexpected {frame.kind} frame")
    return replica.failed_error(pending.capability)
