"""Starting and stopping the worker processes of one replica.

Workers are started with ``spawn`` (a fresh interpreter: no forked locks or CUDA state), inherit
this process's environment and with it its device visibility, and bind their own device. The
ranks of a replica get one rendezvous address (a free port on 127.0.0.1) to make their process
groups at. Startup is complete when every worker has said hello (worker, replica, rank and pid
checked) and then ready; anything else stops every worker of the replica and raises
``WorkerFailed`` with the reason.
Workers notice their parent's death through their pipe (it reads end-of-file) and a parent-pid
check, so a killed host leaves no worker behind.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import socket
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

import attrs

from mizuoto_sdk.errors import WorkerFailed
from mizuoto_sdk.frames import Frame, FrameError, decode, error_from_frame

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess


@attrs.frozen
class WorkerSpec:
    """What one worker process runs: ``target`` (``"module:function"``) is called in the child as
    ``function(connection, config)``. A string, so that it crosses the spawn boundary and a tool
    may name a wrapper of the host's own worker. ``worker`` numbers the worker across the whole
    deployment (replica by replica, rank by rank)."""

    target: str
    config: Mapping[str, Any]
    device: str
    worker: int = 0


def run_worker(target: str, connection: Connection, config: Mapping[str, Any]) -> None:
    """The spawned process's entry: import ``target`` and hand it the pipe."""
    module, _, name = target.partition(":")
    getattr(importlib.import_module(module), name)(connection, config)


class Worker:
    """One started worker process and the parent's end of its pipe."""

    def __init__(self, process: BaseProcess, connection: Connection, rank: int) -> None:
        self.process, self.connection, self.rank = process, connection, rank


def start_workers(
    specs: Sequence[WorkerSpec], replica: int, *, engine_id: str, timeout: float
) -> tuple[list[Worker], dict[str, Any]]:
    """Start one process per rank of ``replica`` and wait for each one's hello and ready.

    Returns the workers and what rank 0 said when ready (its model's name, dtype, device and
    description).
    """
    context = multiprocessing.get_context("spawn")
    workers: list[Worker] = []
    handshake = _Handshake(engine_id, replica, timeout)
    # Ranks of one replica meet there to make their process groups; a fresh port per start.
    rendezvous = f"tcp://127.0.0.1:{free_port()}" if len(specs) > 1 else None
    try:
        for rank, spec in enumerate(specs):
            parent_end, child_end = context.Pipe(duplex=True)
            config = {
                **spec.config,
                "worker": spec.worker,
                "replica": replica,
                "rank": rank,
                "parent": os.getpid(),
                "rendezvous": rendezvous,
            }
            process = context.Process(
                target=run_worker,
                args=(spec.target, child_end, config),
                name=f"mizuoto-{engine_id}-r{replica}.{rank}",
                daemon=True,
            )
            process.start()
            child_end.close()
            workers.append(Worker(process, parent_end, rank))
        for worker, spec in zip(workers, specs, strict=True):
            hello = handshake.expect(worker, "hello")
            expected = {
                "worker": spec.worker,
                "replica": replica,
                "rank": worker.rank,
                "pid": worker.process.pid,
            }
            seen = {key: hello.header.get(key) for key in expected}
            if seen != expected:
                raise handshake.error(f"said hello as {seen}, expected {expected}")
        ready = [handshake.expect(worker, "ready") for worker in workers]
    except BaseException:
        stop_workers(workers, 0.0)
        raise
    return workers, dict(ready[0].header)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stop_workers(workers: Sequence[Worker], grace: float) -> None:
    """Wait ``grace`` seconds for ``workers`` to exit, then terminate, then kill; close pipes."""
    for worker in workers:
        worker.process.join(grace)
    for step in ("terminate", "kill"):
        alive = [w for w in workers if w.process.is_alive()]
        for worker in alive:
            getattr(worker.process, step)()
        for worker in alive:
            worker.process.join(2.0)
    for worker in workers:
        worker.connection.close()
        if worker.process.exitcode is not None:
            worker.process.close()


class _Handshake:
    """The frames a starting worker owes, each by one deadline for the whole startup."""

    def __init__(self, engine_id: str, replica: int, timeout: float) -> None:
        self._engine_id, self._replica, self._timeout = engine_id, replica, timeout
        self._deadline = time.monotonic() + timeout

    def expect(self, worker: Worker, kind: str) -> Frame:
        remaining = self._deadline - time.monotonic()
        ready = wait([worker.connection, worker.process.sentinel], timeout=max(remaining, 0))
        if worker.connection in ready:
            try:
                frame = decode(worker.connection.recv_bytes())
            except (EOFError, OSError, FrameError) as error:
                worker.process.join(1.0)  # a pipe that ends with its process: say how it ended
                if worker.process.exitcode is not None:
                    why = f"exited with code {worker.process.exitcode} before {kind}"
                    raise self.error(why) from None
                raise self.error(f"sent no {kind}: {error or type(error).__name__}") from None
            if frame.kind == kind:
                return frame
            if frame.kind == "failed":
                cause = error_from_frame(frame)
                raise WorkerFailed(
                    f"{self._engine_id}: replica {self._replica} failed to start: {cause.message}",
                    {
                        **cause.detail,
                        "replica": self._replica,
                        "during": "startup",
                        "code": cause.code,
                    },
                )
            raise self.error(f"sent {frame.kind} where {kind} was expected")
        if worker.process.sentinel in ready:
            worker.process.join(0.1)
            raise self.error(f"exited with code {worker.process.exitcode} before {kind}")
        raise self.error(f"sent no {kind} within {self._timeout:g} s")

    def error(self, why: str) -> WorkerFailed:
        return WorkerFailed(
            f"{self._engine_id}: replica {self._replica}'s worker {why}",
            {
                "engine": self._engine_id,
                "replica": self._replica,
                "during": "startup",
                "reason": why,
            },
        )
