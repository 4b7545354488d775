"""What a worker process runs: a host of its own that loads one model and answers frames.

The parent (``mizuoto_sdk.serving.workers.ProcessReplica``) starts it with ``spawn`` and talks to
it over one pipe. Startup is the one place a worker touches process state: it sets torch's thread
count (by default the parent's, so that its output equals inline output bitwise) and binds its
CUDA device. Each request runs on a thread of its own, so a worker answers concurrent requests as
a model in the parent process would; a stream computes a chunk only once the parent asked for it.
The worker exits when its parent dies: the pipe reads end-of-file, or its parent pid changes.
"""

from __future__ import annotations

import heapq
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from mizuoto_sdk.discovery import Discovery
from mizuoto_sdk.errors import EngineError
from mizuoto_sdk.frames import (
    Frame,
    FrameError,
    audio_from_fields,
    chunk_frame,
    decode,
    encode,
    error_frame,
)
from mizuoto_sdk.host.failures import engine_failure
from mizuoto_sdk.host.model import LocalModel
from mizuoto_sdk.host.service import RuntimeService
from mizuoto_sdk.request import EngineRequest

T = TypeVar("T")
_Task = tuple[Callable[[], None], "Callable[[], None] | None"]
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
    threads = _Threads()
    try:
        service, model = threads.call(lambda: _load(config))
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
    send(encode("ready", {**fields, "description": _json(model.description)}))
    running: dict[int, _Served] = {}
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
            served = _Served(frame, model, send, running)
            running[served.id] = served
            threads.run(served.run, then=served.finish)
            continue
        target = running.get(frame.header.get("id"))  # type: ignore[arg-type]  # checked by get
        if target is not None:
            target.handle(frame)
    for served in list(running.values()):
        served.request.cancel()
    service.close()


def error_frame_header(error: EngineError) -> dict[str, object]:
    return {"code": error.code, "message": error.message, "detail": _json(error.detail)}


def _load(config: Mapping[str, Any]) -> tuple[RuntimeService, LocalModel]:
    found = config["discovery"]
    discovery = Discovery(
        path=found["path"],
        entry_points=found["entry_points"],
        selection=None if found["selection"] is None else frozenset(found["selection"]),
    )
    service = RuntimeService(config["settings"], discovery)
    engine = service.engine(config["engine"], config["device"])
    if engine.manifest.uses_torch:
        _bind(config["device"], config.get("threads"))
    model = engine.load(
        config["model"], dtype=config["dtype"], variant=config["variant"], options=config["options"]
    )
    return service, model


def _bind(device: str, threads: int | None) -> None:
    """The worker's own process state, set once before the model loads."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))


def _exit_with_parent(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK)
        os._exit(0)

    threading.Thread(target=watch, name="mizuoto-parent-watch", daemon=True).start()


class _Threads:
    """The threads that run requests, kept for the next ones.

    A request runs on the oldest idle thread, or on a new one when all are busy, so concurrent
    requests never wait for each other while requests one after another run on the same thread:
    the one that loaded the model. torch keeps a thread pool (an OpenMP team) per calling thread,
    and two teams competing for the cores make each call measurably slower.
    """

    def __init__(self) -> None:
        self._idle: list[tuple[int, queue.SimpleQueue[_Task]]] = []  # a heap: oldest first
        self._count = 0
        self._lock = threading.Lock()

    def run(self, task: Callable[[], None], then: Callable[[], None] | None = None) -> None:
        """Run ``task``; ``then()`` once its thread is idle again."""
        with self._lock:
            if self._idle:
                _, inbox = heapq.heappop(self._idle)
            else:
                inbox = queue.SimpleQueue()
                self._count += 1
                threading.Thread(
                    target=self._loop,
                    args=(self._count, inbox),
                    name=f"mizuoto-request-{self._count}",
                    daemon=True,
                ).start()
        inbox.put((task, then))

    def call(self, function: Callable[[], T]) -> T:
        """``function()`` on one of the threads, which is idle again when this returns."""
        outcome: list[T] = []
        failure: list[BaseException] = []
        done = threading.Event()

        def task() -> None:
            try:
                outcome.append(function())
            except BaseException as error:
                failure.append(error)

        self.run(task, done.set)
        done.wait()
        if failure:
            raise failure[0]
        return outcome[0]

    def _loop(self, number: int, inbox: queue.SimpleQueue[_Task]) -> None:
        while True:
            task, then = inbox.get()
            task()
            with self._lock:
                heapq.heappush(self._idle, (number, inbox))
            if then is not None:
                then()


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


class _Served:
    """One request in the worker: the model's call, run on its own thread."""

    def __init__(
        self, frame: Frame, model: LocalModel, send: _Sender, running: dict[int, _Served]
    ) -> None:
        header = frame.header
        self.id = int(header["id"])
        self._header, self._payload = header, frame.payload
        self._model, self._send, self._running = model, send, running
        # The request asks for chunk 0 and allows chunk 1; each "next" allows one more.
        self._credit = threading.Semaphore(2)
        self._last = b""  # the frame that ends the answer (end, result or error)
        self._closing = False
        self.request = EngineRequest(
            params=dict(header.get("params") or {}),
            timeout=header.get("timeout"),
            text_input=queue.Queue() if header.get("text_input") else None,
            progress=self._progress,
        )

    def handle(self, frame: Frame) -> None:
        """A frame about this request from the parent: next, cancel, close or text."""
        if frame.kind == "next":
            self._credit.release()
        elif frame.kind == "cancel":
            self.request.cancel()
            self._credit.release()
        elif frame.kind == "close":
            self._closing = True
            self.request.cancel()  # the chunk it may be computing ahead is not wanted either
            self._credit.release()
        elif frame.kind == "text" and self.request.text_input is not None:
            self.request.text_input.put(frame.header.get("text"))

    def run(self) -> None:
        """Answer the request; its last frame waits for ``finish`` (see ``_Threads``)."""
        self._send(encode("started", {"id": self.id}))
        try:
            self._answer()
        except EngineError as error:
            self._last = error_frame(error, id=self.id, **self._written_back())
        except Exception as error:  # the host maps engine errors; this is the worker's own
            failed = EngineError(f"the worker failed: {type(error).__name__}: {error}")
            self._last = error_frame(failed, id=self.id, **self._written_back())
        finally:
            self._running.pop(self.id, None)

    def finish(self) -> None:
        """Send the last frame once the request's thread is idle again, so that the parent's
        next request, sent as soon as it reads it, finds that thread free (and reuses it)."""
        self._send(self._last)

    def _answer(self) -> None:
        header, model, capability = self._header, self._model, self._header["capability"]
        text = header.get("text")
        audio = audio_from_fields(header["audio"], self._payload) if "audio" in header else None
        inputs = {"synthesize": (text,), "convert": (audio,), "edit": (audio, text)}
        if capability in STREAMS:
            self._stream(getattr(model, capability)(*inputs[capability], request=self.request))
        elif capability == "collect":
            chunk = model.collect(header["of"], *inputs[header["of"]], request=self.request)
            self._send(chunk_frame(chunk, id=self.id))
            self._last = encode("end", {"id": self.id, **self._written_back()})
        elif capability == "prepare_voice":
            assert audio is not None
            value = model.prepare_voice(audio, header["voice_dir"], request=self.request)
            self._result(value)
        else:
            self._result(model.call(header["op"], header.get("arguments"), request=self.request))

    def _stream(self, chunks: Iterator[Any]) -> None:
        try:
            for index in range(1 << 62):
                self._credit.acquire()
                if self._closing:
                    break
                chunk = next(chunks, None)
                if chunk is None:
                    break
                self._send(chunk_frame(chunk, id=self.id, index=index))
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        self._last = encode("end", {"id": self.id, **self._written_back()})

    def _result(self, value: object) -> None:
        try:
            encoded = json.loads(json.dumps(value))
        except (TypeError, ValueError) as error:
            raise EngineError(
                f"the engine's result cannot leave a worker process: JSON only ({error})",
                {"reason": "result_not_json"},
            ) from None
        self._last = encode("result", {"id": self.id, "value": encoded, **self._written_back()})

    def _written_back(self) -> dict[str, object]:
        request = self.request
        return {
            "applied": _json(request.applied),
            "warnings": [str(w) for w in request.warnings],
            "timings": _json(request.timings),
        }

    def _progress(self, done: float, total: float | None, message: str | None) -> None:
        fields = {"id": self.id, "done": done, "total": total, "message": message}
        self._send(encode("progress", fields))


def _json(value: Mapping[str, object]) -> dict[str, Any]:
    return dict(json.loads(json.dumps(dict(value), default=str)))
