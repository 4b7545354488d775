"""One connection to the agent: the hello, then one engine on one device, its model, files and
requests (see ``host/agent.py``, which accepts connections and owns what sessions share).

The hello is read first (``remote/greeting.py``: a small limit, one deadline for all of it, a
TLS handshake included), and nothing else is read before it is accepted. Requests are answered
by ``host/served.py`` exactly as a worker answers its parent. A frame that does not parse, or
whose fields are of the wrong type, is answered with an ``invalid_request`` error naming the
field, and the session goes on; only a frame over the limit (whose body is never read) ends it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from mizuoto_sdk.errors import EngineError, EngineUnavailable, InvalidRequest
from mizuoto_sdk.frames import Frame, FrameError, decode, encode, error_frame
from mizuoto_sdk.host.failures import engine_failure
from mizuoto_sdk.host.model import LocalModel
from mizuoto_sdk.host.served import ServedRequest, json_safe
from mizuoto_sdk.host.service import RuntimeService
from mizuoto_sdk.host.threads import RequestThreads
from mizuoto_sdk.remote.cache import FileCache
from mizuoto_sdk.remote.checks import check_request, is_id, shown
from mizuoto_sdk.remote.files import FILE_SCHEME, folder_files
from mizuoto_sdk.remote.greeting import HELLO_LIMIT, greet, sdk_version
from mizuoto_sdk.remote.wire import FILE_CHUNK, ConnectionClosed, FrameSocket, OversizedFrame

__all__ = ["HELLO_LIMIT", "AgentSide", "Session", "sdk_version"]

_REQUEST_KINDS = ("next", "cancel", "close", "text")
_NOTHING_WRITTEN_BACK: Mapping[str, object] = {"applied": {}, "warnings": [], "timings": {}}


class AgentSide(Protocol):
    """What a session needs of the agent that accepted it (``Agent`` is one)."""

    service: RuntimeService
    token: bytes
    ssl_context: ssl.SSLContext | None
    heartbeat_interval: float
    hello_timeout: float
    frame_limit: int
    files: FileCache
    threads: RequestThreads
    """The threads requests and loads run on, shared by every session: a session that ends
    leaves its threads to the next one."""

    def ready(self) -> dict[str, object]: ...

    def hold(self, model: LocalModel) -> None: ...

    def release(self, model: LocalModel) -> list[str]: ...

    def forget(self, session: Session) -> None: ...


class Session:
    """One connection: one engine on one device, its model and its requests."""

    def __init__(self, agent: AgentSide, connection: socket.socket) -> None:
        self.agent = agent
        self._socket = connection
        self._send_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._closed = threading.Event()
        self._idle = threading.Condition()  # guards _running and _stopping
        self._running: dict[int, ServedRequest] = {}
        self._stopping = False
        self._engine: tuple[str, str] | None = None
        self._model: LocalModel | None = None
        self._failed_puts: dict[tuple[str, str], EngineError] = {}
        self._owner = f"session-{id(self):x}"

    def run(self) -> None:
        try:
            agent = self.agent
            greeted = greet(
                self._socket,
                token=agent.token,
                ssl_context=agent.ssl_context,
                hello_timeout=agent.hello_timeout,
                ready=agent.ready,
            )
            if greeted is not None:
                self._socket = greeted
                threading.Thread(
                    target=self._beat, name="mizuoto-agent-heartbeat", daemon=True
                ).start()
                reader = FrameSocket(self._socket, self.agent.frame_limit)
                while not self._closed.is_set():
                    self._next(reader)
        except OversizedFrame as error:  # its body is unread, so nothing after it can be read
            self._refuse("invalid_request", f"a malformed frame: {error}", {"reason": "frame"})
        except (ConnectionClosed, OSError, ValueError):
            pass  # the host left (or shutdown closed the socket)
        finally:
            self.close()

    def _next(self, reader: FrameSocket) -> None:
        """Read and answer one frame; one that does not parse is answered and the session goes
        on (its length was right, so the next frame begins where it ends)."""
        try:
            frame = reader.receive()
        except FrameError as error:
            if isinstance(error, OversizedFrame):
                raise
            malformed = InvalidRequest(f"a malformed frame: {error}", {"field": "frame"})
            self._send_bytes(error_frame(malformed))
            return
        try:
            self._dispatch(frame)
        except Exception as error:  # a frame's handling must never end the others' requests
            self._send_bytes(error_frame(self._failure(error)))

    def stop(self) -> None:
        """The agent stops: each request in flight is answered with ``engine_unavailable`` and
        cancelled, so that its engine unwinds (``wait_idle``); requests sent now are refused."""
        with self._idle:
            self._stopping = True
            running = list(self._running.values())
        for served in running:
            stopped = EngineUnavailable(
                "the agent is stopping: the request was cancelled", {"reason": "agent_stopped"}
            )
            self._send_bytes(error_frame(stopped, id=served.id, **_NOTHING_WRITTEN_BACK))
            served.handle(Frame("close", {"id": served.id}))

    def wait_idle(self, deadline: float) -> bool:
        """Whether every request of the session ended by ``deadline`` (``time.monotonic()``)."""
        with self._idle:
            return self._idle.wait_for(
                lambda: not self._running, max(0.0, deadline - time.monotonic())
            )

    def close(self) -> None:
        """End the session: cancel its requests, release its model, drop half-sent files."""
        with self._close_lock:  # not the send lock: a send may be stuck on a full socket
            if self._closed.is_set():
                return
            self._closed.set()
            model, self._model = self._model, None
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()
        with self._idle:
            running = list(self._running.values())
        for served in running:
            served.handle(Frame("close", {"id": served.id}))
        if model is not None:
            self.agent.release(model)
        self.agent.files.discard(self._owner)
        self.agent.forget(self)

    def _dispatch(self, frame: Frame) -> None:
        request_id = frame.header.get("id")
        if "id" in frame.header and not is_id(request_id):
            raise InvalidRequest(
                f"a {frame.kind} frame's id: expected an integer, got {shown(request_id)}",
                {"field": "id", "kind": frame.kind},
            )
        if frame.kind == "request":
            self._request(frame)
        elif frame.kind in _REQUEST_KINDS:
            text = frame.header.get("text")
            if frame.kind == "text" and text is not None and not isinstance(text, str):
                raise InvalidRequest(
                    f"a text frame's text: expected a string or null, got {shown(text)}",
                    {"field": "text", "id": request_id},
                )
            with self._idle:
                target = self._running.get(request_id)  # type: ignore[arg-type]  # an int or None
            if target is not None:
                target.handle(frame)
        else:
            operation = _OPERATIONS.get(frame.kind)
            echo = {} if request_id is None else {"id": request_id}
            try:
                if operation is None:
                    raise InvalidRequest(
                        f"a {frame.kind} frame is not something a host sends an agent",
                        {"field": "kind", "reason": "unexpected"},
                    )
                value = operation(self, frame)
            except Exception as error:
                self._send_bytes(error_frame(self._failure(error), **echo))
            else:
                if value is not None:
                    self._send("result", {**echo, **value})

    def _open(self, frame: Frame) -> dict[str, object]:
        engine_id, device = frame.header.get("engine"), frame.header.get("device")
        if self._engine is not None:
            raise InvalidRequest("this session has an engine open already", {"field": "engine"})
        if not isinstance(engine_id, str) or not isinstance(device, str):
            raise InvalidRequest(
                f"open: expected an engine id and a device, got {engine_id!r} and {device!r}",
                {"field": "engine"},
            )
        self.agent.service.engine(engine_id, device).start()
        self._engine = (engine_id, device)
        return {}

    def _load(self, frame: Frame) -> dict[str, object]:
        if self._engine is None:
            raise InvalidRequest("load: open an engine first", {"field": "engine"})
        header = frame.header
        options = header.get("options") or {}
        strings = [header.get(k) for k in ("model", "dtype", "variant")]
        if not isinstance(options, dict) or not all(
            s is None or isinstance(s, str) for s in strings
        ):
            raise InvalidRequest(
                "load: expected model, dtype and variant as strings or null, options an object",
                {"field": "load"},
            )
        engine = self.agent.service.engine(*self._engine)
        # on the threads that run the requests: one torch thread pool for both
        model = self.agent.threads.call(
            lambda: engine.load(strings[0], dtype=strings[1], variant=strings[2], options=options)
        )
        with self._close_lock:  # the session may have closed while the model loaded
            closed = self._closed.is_set()
            previous = self._model
            if model is not previous:
                self.agent.hold(model)
            self._model = None if closed else model
        if previous is not None and previous is not model:
            self.agent.release(previous)
        if closed:  # held by no session: unloaded, unless another session holds it
            self.agent.release(model)
            return {}
        fields = {"name": model.name, "dtype": model.spec.dtype, "device": model.spec.device}
        return {**fields, "description": json_safe(model.description)}

    def _unload(self, frame: Frame) -> dict[str, object]:
        model = self._model
        return {"unloaded": [] if model is None else model.engine.unload(model)}

    def _status(self, frame: Frame) -> dict[str, object]:
        return {"models": json.loads(json.dumps(self.agent.service.describe_models(), default=str))}

    def _have(self, frame: Frame) -> dict[str, object]:
        files = frame.header.get("files")
        if not isinstance(files, list):
            raise InvalidRequest("have: expected files: [{sha256, name, size}]", {"field": "files"})
        return {"missing": self.agent.files.have(files)}

    def _put(self, frame: Frame) -> dict[str, object] | None:
        """One piece of a file; the answer (result or error) comes after the final piece."""
        header = frame.header
        key = (str(header.get("sha256")), str(header.get("name")))
        final = header.get("final") is True
        failed = self._failed_puts.pop(key, None) if final else self._failed_puts.get(key)
        if failed is not None:
            if final:
                raise failed
            return None
        try:
            kept = self.agent.files.put(
                header.get("sha256"),  # type: ignore[arg-type]  # put checks every field
                header.get("name"),  # type: ignore[arg-type]
                header.get("offset"),  # type: ignore[arg-type]
                header.get("size"),  # type: ignore[arg-type]
                final,
                frame.payload,
                owner=self._owner,
            )
        except EngineError as error:
            if not final:
                self._failed_puts[key] = error
                return None
            raise
        return None if kept is None else {"sha256": key[0], "name": key[1]}

    def _request(self, frame: Frame) -> None:
        header = dict(frame.header)
        request_id = header.get("id")
        if request_id is None:
            raise InvalidRequest("a request frame needs an integer id", {"field": "id"})
        assert isinstance(request_id, int)  # _dispatch checked it
        voice: Path | None = None
        try:
            with self._idle:
                if self._stopping:
                    raise EngineUnavailable(
                        "the agent is stopping: it takes no more requests",
                        {"reason": "agent_stopped"},
                    )
                if request_id in self._running:
                    raise InvalidRequest(
                        f"a request with id {request_id} is in flight already",
                        {"field": "id"},
                    )
            if self._model is None or self._engine is None:
                raise InvalidRequest("no model loaded: send open and load first", {"field": "load"})
            check_request(header, frame.payload)
            header["params"] = self._resolved(header.get("params"))
            if header.get("capability") == "prepare_voice":
                voice = Path(tempfile.mkdtemp(prefix="mizuoto-agent-voice-"))
                header["voice_dir"] = str(voice / "voice")
            served = ServedRequest(
                Frame("request", header, frame.payload),
                self._model,
                self._sender(request_id, voice),
            )
        except Exception as error:
            if voice is not None:
                shutil.rmtree(voice, ignore_errors=True)
            self._send_bytes(
                error_frame(self._failure(error), id=request_id, **_NOTHING_WRITTEN_BACK)
            )
            return
        with self._idle:
            self._running[request_id] = served
        self.agent.threads.run(served.run, then=partial(self._answered, served, voice))

    def _answered(self, served: ServedRequest, voice: Path | None) -> None:
        """The request's last frame, once its thread is free for the next request."""
        try:
            served.finish()
        finally:
            if voice is not None:
                shutil.rmtree(voice, ignore_errors=True)
            with self._idle:
                self._running.pop(served.id, None)
                self._idle.notify_all()

    def _sender(self, request_id: int, voice: Path | None) -> Callable[[bytes], None]:
        """The request's send: for prepare_voice, the folder's files go before the result."""
        if voice is None:
            return self._send_bytes

        def send(data: bytes) -> None:
            if decode(data).kind == "result":
                for name, path in folder_files(voice / "voice"):
                    size = path.stat().st_size
                    with path.open("rb") as file:
                        for offset in range(0, max(size, 1), FILE_CHUNK):
                            fields = {"id": request_id, "name": name, "size": size}
                            self._send("file", {**fields, "offset": offset}, file.read(FILE_CHUNK))
            self._send_bytes(data)

        return send

    def _resolved(self, params: object) -> dict[str, Any]:
        """``params`` with each ``mizuoto-file:`` value of a path param replaced by its cached
        path; other values are left to the engine's own checks."""
        if params is None:
            return {}
        if not isinstance(params, dict):
            raise InvalidRequest(f"params: expected an object, got {params!r}", {"field": "params"})
        assert self._engine is not None
        manifest = self.agent.service.discovery.manifest(self._engine[0])
        paths = {p.name for p in manifest.params if p.type == "path"}
        resolved = dict(params)
        for name, value in params.items():
            if name in paths and isinstance(value, str) and value.startswith(FILE_SCHEME):
                resolved[name] = str(self.agent.files.path(value, f"params.{name}"))
        return resolved

    def _failure(self, error: BaseException) -> EngineError:
        if isinstance(error, EngineError):
            return error
        engine_id, device = self._engine or ("?", "?")
        return engine_failure(error, engine_id, device)

    def _beat(self) -> None:
        while not self._closed.wait(self.agent.heartbeat_interval):
            self._send("heartbeat", {})

    def _refuse(self, code: str, message: str, detail: Mapping[str, object]) -> None:
        self._send("refused", {"code": code, "message": message, "detail": dict(detail)})

    def _send(self, kind: str, header: Mapping[str, object], payload: bytes = b"") -> None:
        self._send_bytes(encode(kind, header, payload))

    def _send_bytes(self, data: bytes) -> None:
        """Send one frame whole (frames from several threads never interleave); a connection
        that fails ends the session."""
        if self._closed.is_set():
            return
        try:
            with self._send_lock:
                self._socket.sendall(data)
        except OSError:
            self.close()


_OPERATIONS: Mapping[str, Callable[[Session, Frame], dict[str, object] | None]] = {
    "open": Session._open,
    "load": Session._load,
    "unload": Session._unload,
    "status": Session._status,
    "have": Session._have,
    "put": Session._put,
}
