"""The agent: this machine's engines served to hosts elsewhere over protocol 2 (TCP or TLS).

Each connection is a session (``host/session.py``) on a thread of its own: the host says
``hello`` with the token, ``open``s one engine on one device, ``load``s a model and sends
requests, which are answered by ``host/served.py`` exactly as a worker process answers its
parent. Files arrive by content into the agent's ``FileCache`` (``mizuoto_sdk.remote.cache``),
whose folder the agent adds to the service's ``voices.roots`` so that requests may read the
cached voices; ``prepare_voice`` writes into a fresh temporary folder whose files go back as
``file`` frames before the result. A session that ends cancels its requests and unloads its
model unless another session holds it. The agent sends ``heartbeat`` frames on every session.

Requests and loads run on one set of threads for all sessions (``RequestThreads``), so a session
that ends leaves nothing behind: the threads wait for the next session's requests. A stop
(``shutdown``) answers every request in flight with ``engine_unavailable``, cancels it, and waits
a bounded time (``host.stop_timeout``, 10 s) for the engines to unwind (their ``finally`` blocks
run, the children they started with ``ctx.open_process`` are killed) before it closes the sessions.
"""

from __future__ import annotations

import selectors
import socket
import ssl
import threading
import time
from pathlib import Path

from mizuoto_sdk.host.model import LocalModel
from mizuoto_sdk.host.models import ModelStore, data_home, model_cache
from mizuoto_sdk.host.service import RuntimeService
from mizuoto_sdk.host.session import HELLO_LIMIT, Session, sdk_version
from mizuoto_sdk.host.threads import RequestThreads
from mizuoto_sdk.remote.cache import FileCache
from mizuoto_sdk.remote.wire import MAX_REMOTE_FRAME, PROTOCOL

__all__ = ["COLLECT_EVERY", "HELLO_LIMIT", "Agent"]

COLLECT_EVERY = 24 * 3600.0
"""Seconds between sweeps of the file cache."""


class Agent:
    """Serves ``service``'s engines to hosts that know ``token``.

    ``serve`` binds, ``serve_forever`` accepts connections until ``shutdown``. ``files`` is the
    file cache's folder (default ``<data>/remote/files``); ``devices`` what ``ready`` reports
    (default: the CPU and the accelerators found here); ``heartbeat_interval`` defaults to the
    setting ``remote.heartbeat_interval``, else 5 s.
    """

    def __init__(
        self,
        service: RuntimeService,
        token: bytes,
        *,
        ssl_context: ssl.SSLContext | None = None,
        heartbeat_interval: float | None = None,
        hello_timeout: float = 10.0,
        files: str | Path | None = None,
        devices: list[str] | None = None,
        frame_limit: int = MAX_REMOTE_FRAME,
    ) -> None:
        if not token:
            raise ValueError("an agent needs a non-empty token")
        self.service = service
        self.token = bytes(token)
        self.ssl_context = ssl_context
        configured = service.settings.get("remote.heartbeat_interval")
        self.heartbeat_interval = float(heartbeat_interval or configured or 5.0)
        self.hello_timeout = hello_timeout
        self.frame_limit = frame_limit
        self.files = FileCache(Path(files) if files else data_home() / "remote" / "files")
        self.threads = RequestThreads()
        self._devices = devices
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._sessions: set[Session] = set()
        self._holders: dict[int, int] = {}  # id(model) -> sessions holding it
        self._collected = 0.0

    @property
    def listening(self) -> bool:
        """Whether ``serve`` bound the agent's address."""
        return self._listener is not None

    @property
    def bound_address(self) -> tuple[str, int]:
        """``(host, port)`` the agent listens on (after ``serve``)."""
        if self._listener is None:
            raise RuntimeError("the agent is not listening: call serve() first")
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        """Listen on ``host:port`` (port 0: any free one) and sweep the file cache."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, port))
            listener.listen()
        except OSError:
            listener.close()
            raise
        self._listener = listener
        roots = [str(r) for r in self.service.settings.get("voices.roots") or ()]
        if str(self.files.root.absolute()) not in roots:  # requests read cached voices
            self.service.settings.set("voices.roots", [*roots, str(self.files.root)])
        self._collect()
        return self.bound_address

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Accept connections (a thread each) until ``shutdown``."""
        listener = self._listener
        if listener is None:
            raise RuntimeError("the agent is not listening: call serve() first")
        with selectors.DefaultSelector() as selector:
            selector.register(listener, selectors.EVENT_READ)
            while not self._stopped.is_set():
                if not selector.select(poll_interval):
                    if time.monotonic() - self._collected > COLLECT_EVERY:
                        self._collect()
                    continue
                try:
                    connection, _ = listener.accept()
                    # small frames (a heartbeat, a chunk's end) go out at once, not held (Nagle)
                    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    continue  # the peer gave up before we accepted, or shutdown closed it
                session = Session(self, connection)
                with self._lock:
                    if self._stopped.is_set():
                        connection.close()
                        break
                    self._sessions.add(session)
                threading.Thread(
                    target=session.run, name="mizuoto-agent-session", daemon=True
                ).start()

    def shutdown(self, grace: float | None = None) -> bool:
        """Stop accepting; answer each request in flight with ``engine_unavailable`` and cancel
        it; wait up to ``grace`` seconds (default: the setting ``host.stop_timeout``, 10 s) for
        the requests to unwind; then close every session (models unloaded). Returns whether
        every request ended in time."""
        self._stopped.set()
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            sessions, self._sessions = list(self._sessions), set()
        if grace is None:
            grace = float(self.service.settings.get("host.stop_timeout"))
        deadline = time.monotonic() + grace
        for session in sessions:
            session.stop()
        unwound = all([session.wait_idle(deadline) for session in sessions])
        for session in sessions:
            session.close()
        return unwound

    def ready(self) -> dict[str, object]:
        """What ``ready`` tells a host: versions, devices, engines and their installed models."""
        discovery = self.service.discovery
        engines = [record.id for record in discovery.records() if record.ok]
        store = ModelStore(model_cache(self.service.settings))
        models = {
            engine: [
                entry.id
                for entry in discovery.manifest(engine).models
                if store.status(engine, entry).state == "installed"
            ]
            for engine in engines
        }
        return {
            "protocol": PROTOCOL,
            "version": sdk_version(),
            "devices": self.devices(),
            "engines": engines,
            "models": models,
        }

    def devices(self) -> list[str]:
        if self._devices is None:
            from mizuoto_runtime.devices.probe import probe_devices

            self._devices = ["cpu", *(str(d["device"]) for d in probe_devices())]
        return list(self._devices)

    def hold(self, model: LocalModel) -> None:
        with self._lock:
            self._holders[id(model)] = self._holders.get(id(model), 0) + 1

    def release(self, model: LocalModel) -> list[str]:
        """One session less holds ``model``; the last one unloads it (when its calls end)."""
        with self._lock:
            left = self._holders.get(id(model), 1) - 1
            if left > 0:
                self._holders[id(model)] = left
                return []
            self._holders.pop(id(model), None)
        return model.engine.unload(model)

    def forget(self, session: Session) -> None:
        with self._lock:
            self._sessions.discard(session)

    def _collect(self) -> None:
        self._collected = time.monotonic()
        self.files.collect()
