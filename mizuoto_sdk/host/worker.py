"""What a worker process runs: a host of its own that loads one model and answers frames.

The parent (``mizuoto_sdk.serving.workers.ProcessReplica``) starts it with ``spawn`` and talks to
it over one pipe. Startup is the one place a worker touches process state: it sets torch's thread
count (by default the parent's, so that its output equals inline output bitwise), binds its CUDA
device and, as one rank of several, joins its replica's named process groups. A replica of one
rank answers concurrent requests on threads of its own, as a model in the parent process would; a
replica of several runs them one at a time, in order, so that the ranks' collectives meet. The
answering itself is ``host/served.py``.

A worker stops the same way whether its parent asks (``shutdown``) or dies (the pipe reads
end-of-file, or its parent pid changes): it cancels every request in flight, waits up to the
stop timeout (the ``shutdown`` frame's ``grace``, else ``host.stop_timeout``) for them to unwind,
so that the engines' ``finally`` blocks run and their children end, closes its model, kills any
child an engine started through ``ctx.open_process`` that still runs, and exits.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from mizuoto_runtime.process import kill_children
from mizuoto_sdk.discovery import Discovery
from mizuoto_sdk.errors import EngineError
from mizuoto_sdk.frames import (
    FrameError,
    decode,
    encode,
)
from mizuoto_sdk.host.binding import bind_process
from mizuoto_sdk.host.failures import engine_failure
from mizuoto_sdk.host.lockstep import Lockstep
from mizuoto_sdk.host.model import LocalModel
from mizuoto_sdk.host.served import ServedRequest, json_safe
from mizuoto_sdk.host.service import RuntimeService
from mizuoto_sdk.host.stopping import STOP_TIMEOUT
from mizuoto_sdk.host.threads import RequestThreads

STREAMS = ("synthesize", "convert", "edit")
PARENT_CHECK = 0.5
"""Seconds between checks that the parent process is still there."""


def serve(connection: Connection, config: Mapping[str, Any]) -> None:
    """Load ``config``'s model and answer requests from ``connection`` until told to stop."""
    send = _Sender(connection)
    stop = _Stop(float(config.get("stop_timeout") or STOP_TIMEOUT), send)
    _watch_parent(int(config["parent"]), stop)
    send(
        encode(
            "hello", {k: config[k] for k in ("worker", "replica", "rank")} | {"pid": os.getpid()}
        )
    )
    # The model loads on a request thread, which then serves the first request: torch keeps a
    # thread pool per calling thread, and one pool for loading and calling is measurably faster
    # than two competing for the cores.
    # A replica of several ranks runs its requests one at a time, in the order they came, so
    # that every rank's collectives meet in the same order.
    threads = RequestThreads(limit=1 if config.get("rendezvous") else None)
    try:
        service, model, lockstep = threads.call(lambda: _load(config))
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt):
            raise
        failed = (
            error
            if isinstance(error, EngineError)
            else engine_failure(error, str(config["engine"]), str(config["device"]))
        )
        send(encode("failed", error_frame_header(failed)))
        return
    running = stop.serving(service)
    fields = {"name": model.name, "dtype": model.spec.dtype, "device": model.spec.device}
    send(encode("ready", {**fields, "description": json_safe(model.description)}))
    while True:
        try:
            frame = decode(connection.recv_bytes())
        except (EOFError, OSError):
            stop.orphaned()  # the parent is gone; never returns
        except FrameError:
            continue  # the parent never sends one; drop it rather than guess
        if frame.kind == "shutdown":
            grace = frame.header.get("grace")
            stop.now(float(grace) if isinstance(grace, int | float) else None)
            break
        if frame.kind == "request":
            served = ServedRequest(frame, model, send, lockstep)
            running.add(served)
            threads.run(served.run, then=running.finisher(served))
            continue
        target = running.get(frame.header.get("id"))
        if target is not None:
            target.handle(frame)
    if lockstep is not None:
        lockstep.close()


class _Running:
    """The requests this worker answers now, so that a stop can cancel them and wait."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._requests: dict[int, ServedRequest] = {}

    def add(self, served: ServedRequest) -> None:
        with self._lock:
            self._requests[served.id] = served

    def get(self, request_id: object) -> ServedRequest | None:
        with self._lock:
            return self._requests.get(request_id) if isinstance(request_id, int) else None

    def finisher(self, served: ServedRequest) -> Callable[[], None]:
        """What runs once ``served``'s thread is idle again: its last frame, then it is gone."""

        def finish() -> None:
            try:
                served.finish()
            finally:
                with self._lock:
                    self._requests.pop(served.id, None)
                    self._lock.notify_all()

        return finish

    def stop(self, deadline: float) -> bool:
        """Stop every request and wait until ``deadline`` (``time.monotonic()``) for them to
        end; whether they all did."""
        with self._lock:
            requests = list(self._requests.values())
        for served in requests:
            served.stop()
        with self._lock:
            return self._lock.wait_for(
                lambda: not self._requests, max(0.0, deadline - time.monotonic())
            )


class _Stop:
    """How the worker ends, once: on ``shutdown`` from the parent, or on the parent's death."""

    def __init__(self, grace: float, send: _Sender) -> None:
        self._grace = grace
        self._send = send
        self._once = threading.Lock()
        self._done = threading.Event()
        self._service: RuntimeService | None = None
        self._running = _Running()

    def serving(self, service: RuntimeService) -> _Running:
        """The model is loaded: a stop from now on ends its requests and closes ``service``."""
        self._service = service
        return self._running

    def now(self, grace: float | None = None) -> None:
        """Cancel every request, wait up to ``grace`` seconds for them to unwind, close the
        model (its calls left get what remains of the time), kill the children left."""
        if not self._once.acquire(blocking=False):
            self._done.wait()  # another thread stops the worker: its stop is bounded
            return
        try:
            deadline = time.monotonic() + (self._grace if grace is None else grace)
            self._running.stop(deadline)
            self._send.mute()  # the requests' last frames are sent; nobody reads later ones
            if self._service is not None:
                self._service.close(grace=max(0.0, deadline - time.monotonic()))
        finally:
            kill_children()
            self._done.set()

    def orphaned(self) -> NoReturn:
        """The parent is gone: stop as asked to, then exit (no one is owed a tidy end)."""
        self._send.mute()
        self.now()
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os._exit(0)


def error_frame_header(error: EngineError) -> dict[str, object]:
    return {"code": error.code, "message": error.message, "detail": json_safe(error.detail)}


def _load(config: Mapping[str, Any]) -> tuple[RuntimeService, LocalModel, Lockstep | None]:
    found = config["discovery"]
    discovery = Discovery(
        path=found["path"],
        entry_points=found["entry_points"],
        selection=None if found["selection"] is None else frozenset(found["selection"]),
    )
    service = RuntimeService(config["settings"], discovery)
    engine = service.engine(config["engine"], config["device"])
    lockstep = None
    if engine.manifest.uses_torch:
        bind_process(config["device"], config.get("threads"))
        if config.get("rendezvous"):  # a replica of several ranks: its named groups first
            from mizuoto_runtime.parallel import Groups

            groups = Groups.start(
                config["layout"],
                config["rank"],
                init_method=config["rendezvous"],
                backend=config["backend"],
            )
            service.runtime.parallel = groups
            lockstep = Lockstep(groups)
    model = engine.load(
        config["model"], dtype=config["dtype"], variant=config["variant"], options=config["options"]
    )
    return service, model, lockstep


def _watch_parent(parent: int, stop: _Stop) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK)
        stop.orphaned()

    threading.Thread(target=watch, name="mizuoto-parent-watch", daemon=True).start()


class _Sender:
    """The worker's end of its pipe, for every thread; a pipe that broke (the parent is gone,
    which the main loop and the parent watch act on) or a muted one drops what is sent."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        self._muted = False

    def __call__(self, data: bytes) -> None:
        with self._lock:
            if self._muted:
                return
            try:
                self._connection.send_bytes(data)
            except (OSError, ValueError):
                self._muted = True

    def mute(self) -> None:
        self._muted = True
