"""Starting and stopping the worker processes of one replica.

Workers are started with ``spawn`` (a fresh interpreter: no forked locks or CUDA state), inherit
this process's environment and with it its device visibility, and bind their own device. The
ranks of a replica get one rendezvous address (a free port on 127.0.0.1) to make their process
groups at. Startup is complete when every worker has said hello (worker, replica, rank and pid
checked) and then ready; anything else stops every worker of the replica and raises
``WorkerFailed`` with the reason.
Workers notice their parent's death through their pipe (it reads end-of-file) and a parent-pid
check, so a killed host leaves no worker behind. A worker's standard output is its standard error
from its first line on: a command whose output a caller reads through a pipe sees that pipe end
when the command ends, whatever its workers (and the children their engines started) still do.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import signal
import socket
import sys
import threading
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
    """The spawned process's entry: let go of the parent's standard output, import ``target``
    and hand it the pipe."""
    with contextlib.suppress(OSError, ValueError):  # stderr closed: stdout stays as it was
        sys.stdout.flush()
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    module, _, name = target.partition(":")
    getattr(importlib.import_module(module), name)(connection, config)


KILL_WAIT = 5.0
"""Seconds to wait for a killed worker to be reaped."""


class Worker:
    """One started worker process and the parent's end of its pipe."""

    def __init__(self, process: BaseProcess, connection: Connection, rank: int) -> None:
        self.process, self.connection, self.rank = process, connection, rank
        self.stopped = False  # stop_workers has ended it and closed its pipe

    def exit_status(self, timeout: float) -> str | None:
        """How the process ended (``"was killed by SIGKILL (code -9)"``, ``"exited with code
        5"``), waiting up to ``timeout`` seconds for it to end; None if it still runs."""
        deadline = time.monotonic() + timeout
        try:
            ended = wait([self.process.sentinel], timeout=timeout)
            code = self.process.exitcode
            # Another thread may be reaping it this moment: the code appears once it has it.
            while code is None and ended and time.monotonic() < deadline:
                threading.Event().wait(0.01)
                code = self.process.exitcode
        except ValueError:  # closed: whoever stopped it has said how it ended
            return None
        return None if code is None else exit_reason(code)


def exit_reason(code: int) -> str:
    """What an exit code says: a negative one is the signal that killed the process."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (code {code})"
    return f"exited with code {code}"


class Startup:
    """One start of a replica's workers, which another thread may end at once (``cancel``): the
    workers started so far are killed, and the start fails."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workers: list[Worker] = []
        self.cancelled = False

    def add(self, worker: Worker) -> None:
        with self._lock:
            self._workers.append(worker)
            cancelled = self.cancelled
        if cancelled:  # too late to be seen by cancel: it never runs
            worker.process.kill()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            workers = list(self._workers)
        for worker in workers:
            with contextlib.suppress(ValueError, OSError):  # closed or reaped by the start
                worker.process.kill()


def start_workers(
    specs: Sequence[WorkerSpec],
    replica: int,
    *,
    engine_id: str,
    timeout: float,
    startup: Startup | None = None,
) -> tuple[list[Worker], dict[str, Any]]:
    """Start one process per rank of ``replica`` and wait for each one's hello and ready, for
    ``timeout`` seconds in all (``engines.<id>.start_timeout``); ``startup.cancel()`` ends the
    wait at once.

    Returns the workers and what rank 0 said when ready (its model's name, dtype, device and
    description).
    """
    context = multiprocessing.get_context("spawn")
    workers: list[Worker] = []
    startup = startup if startup is not None else Startup()
    handshake = _Handshake(engine_id, replica, timeout, startup)
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
            startup.add(workers[-1])
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
    """Wait ``grace`` seconds in all for ``workers`` to exit, then kill them; close pipes.

    A worker has been asked to stop (``shutdown``) when it is given a grace, and handles no
    signal: SIGTERM would end it as SIGKILL does, except one stopped with SIGSTOP, which only
    SIGKILL ends."""
    workers = [w for w in workers if not w.stopped]
    deadline = time.monotonic() + grace
    for worker in workers:
        worker.process.join(max(0.0, deadline - time.monotonic()))
    alive = [w for w in workers if w.process.is_alive()]
    for worker in alive:
        worker.process.kill()
    for worker in alive:
        worker.process.join(KILL_WAIT)
    for worker in workers:
        worker.stopped = True
        worker.connection.close()
        if worker.process.exitcode is not None:
            worker.process.close()


class _Handshake:
    """The frames a starting worker owes, each by one deadline for the whole startup."""

    def __init__(self, engine_id: str, replica: int, timeout: float, startup: Startup) -> None:
        self._engine_id, self._replica, self._timeout = engine_id, replica, timeout
        self._deadline = time.monotonic() + timeout
        self._startup = startup

    def expect(self, worker: Worker, kind: str) -> Frame:
        remaining = self._deadline - time.monotonic()
        ready = wait([worker.connection, worker.process.sentinel], timeout=max(remaining, 0))
        if self._startup.cancelled:
            raise self.error(f"was stopped before {kind}: the model was closed")
        if worker.connection in ready:
            try:
                frame = decode(worker.connection.recv_bytes())
            except (EOFError, OSError, FrameError) as error:
                ended = worker.exit_status(1.0)  # a pipe that ends with its process: say how
                if ended is not None:
                    raise self.error(f"{ended} before {kind}") from None
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
            raise self.error(f"{worker.exit_status(1.0) or 'ended'} before {kind}")
        raise self.error(
            f"sent no {kind} within {self._timeout:g} s (engines.{self._engine_id}."
            "start_timeout); raise it if loading takes longer"
        )

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
