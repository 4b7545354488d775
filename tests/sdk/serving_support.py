"""Helpers for the serving tests, importable by the worker processes they spawn.

``corrupting_serve`` is a worker target (``RuntimeService(..., worker=CORRUPTING)``): the host's
own ``serve`` over a pipe that watches what the worker sends. It counts the chunks each request
sent (the worker sends a chunk as soon as the engine computed it) and answers the ``echo`` op's
``{"report": "chunks"}`` with those counts. It breaks a frame on request: ``echo`` of
``{"corrupt": "frame"}`` sends bytes that are no frame, ``{"corrupt": "kind"}`` a frame of the
wrong kind, and chunk 1 of a stream seeded ``CORRUPT_SEED`` arrives with its payload cut short.
Spawned children get this folder through the parent's ``sys.path``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

from mizuoto_sdk.discovery import Discovery
from mizuoto_sdk.frames import decode, encode
from mizuoto_sdk.host import RuntimeService
from mizuoto_sdk.host.worker import serve

SITE = Path(__file__).parent / "serving_site"
HERE = Path(__file__).parent
CORRUPTING = "serving_support:corrupting_serve"
CORRUPT_SEED = 666_013
"""A stream with this seed gets chunk 1 with a payload that does not match its shape."""

T = TypeVar("T")


def faulty_service(
    settings: Mapping[str, object] | None = None, worker: str | None = None
) -> RuntimeService:
    """A service that finds the ``faulty`` fixture engine (the site must be on sys.path)."""
    discovery = Discovery(path=[str(SITE)], selection=None)
    if worker is None:
        return RuntimeService(settings, discovery)
    return RuntimeService(settings, discovery, worker=worker)


def wait_until(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``probe`` until it returns something true, up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        threading.Event().wait(0.02)


def process_state(pid: int) -> str | None:
    """The process's state letter from /proc (``Z`` for a zombie), or None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped does not count)."""
    return process_state(pid) not in (None, "Z", "X")


def spawned_children() -> set[int]:
    """This process's children started by multiprocessing's spawn (worker processes; not its
    resource tracker), zombies included: a child nobody reaped is left over too."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        state, parent = stat.rsplit(")", 1)[1].split()[:2]
        if int(parent) == os.getpid() and (b"spawn_main" in command or state == "Z"):
            found.add(int(entry.name))
    return found


def worker_pids(handle: Any) -> list[int]:
    return [pid for replica in handle.replicas for pid in replica.pids]


def stream_report(handle: Any, seed: int) -> dict[str, Any] | None:
    """What the worker did for the stream seeded ``seed``: ``chunks`` sent and whether it
    ``ended``; None before it started. Asks a one-replica handle served by ``corrupting_serve``."""
    report = handle.call("echo", {"report": "chunks"})
    for stream in report["streams"]:
        if stream["seed"] == seed:
            return dict(stream)
    return None


def chunks_computed(handle: Any, seed: int) -> int | None:
    """How many chunks the worker sent for the stream seeded ``seed``, once that stream ended in
    the worker (None before)."""
    stream = stream_report(handle, seed)
    return int(stream["chunks"]) if stream is not None and stream["ended"] else None


def corrupting_serve(connection: Connection, config: Mapping[str, Any]) -> None:
    serve(_Watched(connection), config)  # type: ignore[arg-type]  # the calls serve makes


class _Watched:
    """A worker's pipe that counts and, on request, breaks what the worker sends."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._seeds: dict[int, object] = {}
        self._sent: dict[int, int] = {}
        self._ended: set[int] = set()

    def recv_bytes(self) -> bytes:
        data = self._connection.recv_bytes()
        frame = decode(data)
        request_id = frame.header.get("id")
        if frame.kind == "request":
            self._seeds[request_id] = (frame.header.get("params") or {}).get("seed")
            self._sent[request_id] = 0
        return data

    def send_bytes(self, data: bytes) -> None:
        frame = decode(data)
        request_id = frame.header.get("id")
        if frame.kind == "chunk":
            self._sent[request_id] = self._sent.get(request_id, 0) + 1
            if self._seeds.get(request_id) == CORRUPT_SEED and frame.header["metadata"]["index"]:
                data = encode("chunk", frame.header, frame.payload[:-2])
        elif frame.kind in ("end", "error"):
            self._ended.add(request_id)
        elif frame.kind == "result" and isinstance(frame.header.get("value"), dict):
            value = frame.header["value"]
            if value.get("corrupt") == "frame":
                data = b"not a frame"
            elif value.get("corrupt") == "kind":
                data = encode("hello", {"id": request_id})
            elif value.get("report") == "chunks":
                streams = [
                    {
                        "seed": self._seeds.get(i),
                        "chunks": n,
                        "ended": i in self._ended,
                    }
                    for i, n in self._sent.items()
                ]
                data = encode("result", {**frame.header, "value": {"streams": streams}})
        self._connection.send_bytes(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)


# A host process for the orphan tests: serves a two-replica deployment, prints its workers'
# pids and waits to be killed. argv: the marker folder ("" for none), then the folders to put
# first on sys.path (this one, the site). With a marker folder, a stream runs on a thread first,
# whose engine starts a child at chunk 1 and waits there for a cancel (fault=child).
HOST_SCRIPT = """
import faulthandler, sys, threading
faulthandler.dump_traceback_later(120, exit=True)  # a bound, should the test never kill it
marker = sys.argv[1]
sys.path[:0] = sys.argv[2:]
from serving_support import faulty_service, worker_pids
from mizuoto_sdk.host import EngineRequest
service = faulty_service({"engines.faulty.replicas": 2})
model = service.load("faulty").start()
if marker:
    params = {"fault": "child", "at": 1, "marker": marker}
    stream = model.synthesize("hi", EngineRequest(params=params))
    threading.Thread(target=lambda: list(stream), daemon=True).start()
print(*worker_pids(model), flush=True)
sys.stdin.read()
"""
