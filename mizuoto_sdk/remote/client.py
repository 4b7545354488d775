"""The host's side of a remote engine: one session with an agent, as a replica of a handle.

``RemoteReplica`` answers what ``serving.exchange`` and ``serving.handle`` ask of a replica, so a
remote model's streams, cancels, timeouts and written-back fields behave as a local one's. It
connects on the first request (``remote/handshake.py``: hello, ``open``, ``load``, within
``remote.load_timeout`` or that request's own timeout); then requests go out exactly as to a
worker process. A reader thread routes the agent's frames to their requests; a watch thread
forwards cancels, frees the caller of a stopped request the agent does not answer, and fails the
session when the agent has been silent for ``heartbeat_timeout`` seconds (it sends a heartbeat
every few). A lost session fails the requests in flight with ``worker_failed`` (``detail``: the
host and what was going on) and the replica stays healthy: the next request connects again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from mizuoto_sdk.errors import EngineError, EngineUnavailable, WorkerFailed
from mizuoto_sdk.frames import Frame, FrameError, error_from_frame
from mizuoto_sdk.remote.handshake import Deadline, open_session, session_detail, session_failed
from mizuoto_sdk.remote.hosts import RemoteHost, sdk_version
from mizuoto_sdk.remote.wire import ConnectionClosed, FrameSocket
from mizuoto_sdk.request import EngineRequest
from mizuoto_sdk.serving.inflight import InFlight, Pending
from mizuoto_sdk.serving.routing import ReplicaStatus
from mizuoto_sdk.serving.workers import CANCEL_INTERVAL, IDLE_INTERVAL

__all__ = ["RemoteHost", "RemoteReplica", "sdk_version"]

log = logging.getLogger(__name__)


class _Session:
    """One connection to the agent: its frames, and when the last one arrived."""

    def __init__(self, wire: FrameSocket) -> None:
        self.wire = wire
        self.last_seen = time.monotonic()
        self.done = threading.Event()
        self.threads: list[threading.Thread] = []


class RemoteReplica:
    """The one replica of a remote model: a session with an agent, made again when lost."""

    def __init__(
        self,
        host: RemoteHost,
        *,
        engine_id: str,
        device: str,
        load: Mapping[str, object],
        replica_id: int = 0,
    ) -> None:
        self.id = replica_id
        self.host = host
        self.devices: tuple[str, ...] = (f"{host.name}/{device}",)
        self.metadata: dict[str, Any] = {}
        self.agent: dict[str, Any] = {}
        """What the agent said when it accepted the last session (version, devices, engines)."""
        self.state = "stopped"
        self.failure: str | None = None
        self._engine_id, self._device, self._load = engine_id, device, dict(load)
        self._session: _Session | None = None
        self._lock = threading.RLock()  # session, requests
        self._requests = InFlight(self._lock)
        self._start_lock = threading.Lock()
        self._closed = threading.Event()

    # -- what routing and the handle read ---------------------------------------------------

    @property
    def healthy(self) -> bool:
        """True until closed: a lost session is made again by the next request."""
        return not self._closed.is_set()

    @property
    def in_flight(self) -> int:
        return self._requests.count

    def reserve(self) -> None:
        self._requests.reserve()

    def release(self) -> None:
        self._requests.release()

    def status(self) -> ReplicaStatus:
        with self._lock:
            return ReplicaStatus(
                self.id, self.healthy, self.in_flight, self.devices, (), self.state, self.failure
            )

    # -- the session -------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Connect, say hello, open the engine and load the model, unless a session is open.

        The agent's own refusal or error comes out as it sent it (its code and detail, plus
        ``host``); a connection that fails comes out as ``worker_failed`` (``during``: the step);
        a start past ``remote.load_timeout`` or ``timeout`` (a request's, when it starts the
        session) as ``operation_timeout``, and the session is closed.
        """
        deadline = Deadline.start(self.host, timeout)
        with self._start_lock:
            if self._closed.is_set():
                raise self._closed_error()
            if self._session is not None:
                return
            self.state = "starting"
            try:
                session = self._connect(deadline)
            except BaseException as error:
                self.state = "stopped"
                self.failure = error.message if isinstance(error, EngineError) else str(error)
                raise
            with self._lock:
                closed = self._closed.is_set()
                if not closed:
                    self._session, self.state, self.failure = session, "ready", None
            if closed:
                session.wire.close()
                raise self._closed_error()
            for target in (self._read, self._watch):
                thread = threading.Thread(
                    target=target,
                    args=(session,),
                    name=f"mizuoto-remote-{self.host.name}{target.__name__}",
                    daemon=True,
                )
                session.threads.append(thread)
                thread.start()

    def _connect(self, deadline: Deadline) -> _Session:
        wire, self.agent, self.metadata = open_session(
            self.host, self._engine_id, self._device, self._load, deadline
        )
        return _Session(wire)

    def _read(self, session: _Session) -> None:
        """Route the agent's frames to their requests until the connection ends."""
        while True:
            try:
                frame = session.wire.receive()
            except ConnectionClosed:
                self._lose(session, "the agent closed the connection")
                return
            except FrameError as error:
                self._lose(session, f"the agent sent a malformed frame ({error})")
                return
            except OSError as error:
                self._lose(session, f"the connection failed ({error})")
                return
            session.last_seen = time.monotonic()
            request_id = frame.header.get("id")
            with self._lock:
                pending = self._requests.get(request_id) if self._session is session else None
                if pending is None or frame.kind in ("started", "heartbeat"):
                    continue
                if pending.answered:
                    continue  # its caller was freed already (see _watch)
                if frame.kind == "chunk":
                    pending.received += 1
                pending.answered = frame.kind in ("end", "result", "error")
            pending.frames.put(frame)

    def _watch(self, session: _Session) -> None:
        """Forward cancels (as a worker replica does), free the callers of stopped requests the
        agent does not answer, and notice the agent's silence."""
        limit = self.host.heartbeat_timeout
        wake = CANCEL_INTERVAL
        while not session.done.wait(wake):
            silent = time.monotonic() - session.last_seen
            if silent > limit:
                reason = f"no frame from the agent for {limit:g} s (remote.heartbeat_timeout)"
                self._lose(session, reason, "heartbeat")
                return
            with self._lock:
                pending = self._requests.all() if self._session is session else []
            for item in self._requests.cancels_due(pending):
                self.send("cancel", {"id": item.id})
            self._free_unanswered(pending)
            wake = min(CANCEL_INTERVAL if pending else IDLE_INTERVAL, limit - silent + 0.01)

    def _free_unanswered(self, pending: list[Pending]) -> None:
        """A request cancelled or past its own timeout whose answer has not come
        ``stop_timeout`` seconds later (an engine deaf to its cancel): its caller gets
        ``cancelled`` or ``operation_timeout`` now and the agent is told to cancel it. The
        session goes on: the agent still answers (its heartbeats come), only that engine call
        does not."""
        grace = self.host.stop_timeout
        why = f"the agent did not end it within {grace:g} s (host.stop_timeout)"
        for item in self._requests.unanswered(pending, grace):
            with self._lock:
                if item.answered:
                    continue
                item.answered = True
            log.warning(
                "%s on %s: a %s request: %s", self._engine_id, self.host.name, item.capability, why
            )
            item.frames.put(item.stop_error(why))
            self.send("cancel", {"id": item.id})

    def _lose(self, session: _Session, reason: str, during: str | None = None) -> None:
        """End ``session``: its requests fail with ``worker_failed``; the next one reconnects."""
        with self._lock:
            if session.done.is_set():
                return
            session.done.set()
            pending: list[Pending] = []
            if self._session is session:
                self._session = None
                self.state, self.failure = "stopped", reason
                pending = self._requests.take_all()
        session.wire.close()
        if pending:
            log.warning("%s on %s: %s", self._engine_id, self.host.name, reason)
        for item in pending:
            item.frames.put(self._failed(reason, during or item.capability))

    # -- requests ----------------------------------------------------------------------------

    def open(self, header: Mapping[str, object], payload: bytes, request: EngineRequest) -> Pending:
        """Send a request to the agent and return its channel (connecting first if needed,
        within the request's timeout)."""
        self.start(request.timeout)
        capability = str(header.get("capability"))
        with self._lock:
            if self._session is None:
                raise self.failed_error(capability)
            pending = self._requests.add(request, capability)
        self.send("request", {**header, "id": pending.id}, payload)
        return pending

    def send(
        self,
        kind: str,
        header: Mapping[str, object],
        payload: bytes = b"",
        *,
        every_rank: bool = False,
    ) -> None:
        """Send a frame on the session; a broken connection ends it (nothing to send on: a
        frame about a request the session took down with it is dropped)."""
        session = self._session
        if session is None:
            return
        try:
            session.wire.send(kind, header, payload)
        except OSError as error:
            self._lose(session, f"the connection failed sending {kind} ({error})")

    def ask(self, kind: str, frames: Iterable[tuple[Mapping[str, object], bytes]]) -> Frame:
        """One exchange outside a request (``have``; ``put``, a file in several frames): the
        frames go out under one id of their own, and the agent's ``result`` comes back; its
        ``error`` is raised."""
        self.start()
        with self._lock:
            if self._session is None:
                raise self.failed_error(kind)
            pending = self._requests.add(EngineRequest(), kind)
            self._requests.reserve()  # finish() counts it out
        try:
            for header, payload in frames:
                self.send(kind, {**header, "id": pending.id}, payload)
            frame = pending.next_frame()
            if frame.kind == "error":
                raise error_from_frame(frame)
            if frame.kind != "result":
                self.fail(f"the agent answered {kind} with {frame.kind}")
                raise self.failed_error(kind)
            return frame
        finally:
            self.finish(pending)

    def ask_next(self, pending: Pending) -> None:
        with self._lock:
            pending.allowed += 1
            pending.asked = time.monotonic()
        self.send("next", {"id": pending.id})

    def has_pending(self, pending: Pending) -> bool:
        return self._requests.has(pending)

    def finish(self, pending: Pending) -> None:
        self._requests.finish(pending)

    # -- failing and closing -----------------------------------------------------------------

    def fail(self, reason: str) -> None:
        """End the current session (a malformed or unexpected frame); the replica stays
        healthy."""
        session = self._session
        if session is not None:
            self._lose(session, reason)

    def failed_error(self, during: str) -> WorkerFailed:
        return self._failed(self.failure or "the session ended", during)

    def close(self) -> None:
        """Close the session (the agent unloads what it loaded for it); in-flight requests fail
        with ``engine_unavailable``. Idempotent."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            session, self._session = self._session, None
            pending = self._requests.take_all()
            self.state = "stopped"
        for item in pending:
            item.frames.put(self._closed_error())
        if session is not None:
            session.done.set()
            session.wire.close()
            for thread in session.threads:
                if thread is not threading.current_thread():
                    thread.join(5.0)

    def _failed(self, reason: str, during: str) -> WorkerFailed:
        return session_failed(self.host, self._engine_id, reason, during)

    def _closed_error(self) -> EngineUnavailable:
        return EngineUnavailable(
            f"{self._engine_id}: the model was closed", self._detail(reason="closed")
        )

    def _detail(self, **fields: object) -> dict[str, object]:
        return session_detail(self.host, self._engine_id, **fields)
