"""What a worker process runs: a host of its own that loads one model and answers frames.

The parent (``mizuoto_sdk.serving.workers.ProcessReplica``) starts it with ``spawn`` and talks to
it over one pipe. Startup is the one place a worker touches process state: it sets torch's thread
count (by default the parent's, so that its output equals inline output bitwise), binds its CUDA
device and, as one rank of several, joins its replica's named process groups. A replica of one
rank answers concurrent requests on threads of its own, as a model in the parent process would; a
replica of several runs them one at a time, in order, so that the ranks' collectives meet. The
answering itself is ``host/served.py``. The worker exits when its parent dies: the pipe reads
end-of-file, or its parent pid changes.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

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
from mizuoto_sdk.host.threads import RequestThreads

STREAMS = ("synthesize", "convert", "edit")
PARENT_CHECK = 0.5
"""Seconds between checks that the parent process is still there."""


def serve(connection: Connection, config: Mapping[str, Any]) -> None:
    """Load ``config``'s model and answer requests from ``connection`` until told to stop."""
    _exit_with_parent(int(config["parent"]))
    send = _Sender(connection)
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
    fields = {"name": model.name, "dtype": model.spec.dtype, "device": model.spec.device}
    send(encode("ready", {**fields, "description": json_safe(model.description)}))
    running: dict[int, ServedRequest] = {}
    while True:
        try:
            frame = decode(connection.recv_bytes())
        except (EOFError, OSError):
            os._exit(0)  # the parent is gone: nobody is owed an answer or a tidy exit
        except FrameError:
            continue  # the parent never sends one; drop it rather than guess
        if frame.kind == "shutdown":
            break
        if frame.kind == "request":
            served = ServedRequest(frame, model, send, lockstep)
            running[served.id] = served
            threads.run(served.run, then=partial(_finish, served, running))
            continue
        target = running.get(frame.header.get("id"))  # type: ignore[arg-type]  # checked by get
        if target is not None:
            target.handle(frame)
    for served in list(running.values()):
        served.request.cancel()
    service.close()
    if lockstep is not None:
        lockstep.close()


def _finish(served: ServedRequest, running: dict[int, ServedRequest]) -> None:
    running.pop(served.id, None)
    served.finish()


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


def _exit_with_parent(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK)
        os._exit(0)

    threading.Thread(target=watch, name="mizuoto-parent-watch", daemon=True).start()


class _Sender:
    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._lock = threading.Lock()

    def __call__(self, data: bytes) -> None:
        try:
            with self._lock:
                self._connection.send_bytes(data)
        except (OSError, ValueError):
            os._exit(0)  # the parent is gone
