"""One replica run by worker processes: its requests, its monitor, and a failure that stays its own.

Each replica has its own supervisor (``ProcessReplica``), so a crash, a malformed frame or an
execution timeout in one replica fails that replica's requests and no other's. Starting and
stopping the processes themselves is ``serving.processes``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any, Literal

from mizuoto_sdk.errors import EngineError, EngineUnavailable, WorkerFailed
from mizuoto_sdk.frames import FrameError, decode, encode
from mizuoto_sdk.serving.inflight import InFlight, Pending
from mizuoto_sdk.serving.processes import Worker, WorkerSpec, start_workers, stop_workers
from mizuoto_sdk.serving.routing import ReplicaStatus

if TYPE_CHECKING:
    from mizuoto_sdk.request import EngineRequest

log = logging.getLogger(__name__)

CANCEL_INTERVAL = 0.05
"""How often the supervisor looks at the cancel events of requests in flight (seconds).

Every wake-up of this process can take a core from a worker's torch threads (on a machine whose
cores they fill, that stalls their parallel regions), so the supervisor wakes no more often than
this while requests are in flight, at an execution deadline, and otherwise only for a frame."""
IDLE_INTERVAL = 1.0
RESTART_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
"""Seconds before each restart attempt of a failed replica; the last repeats."""


class ProcessReplica:
    """A replica whose ranks are worker processes (one rank each); requests go to rank 0."""

    def __init__(
        self,
        replica_id: int,
        specs: Sequence[WorkerSpec],
        *,
        engine_id: str,
        execution_timeout: float | None = None,
        restart: Literal["never", "on_failure"] = "never",
        startup_timeout: float = 600.0,
        shutdown_timeout: float = 5.0,
    ) -> None:
        self.id = replica_id
        self.devices = tuple(spec.device for spec in specs)
        self._specs = tuple(specs)
        self._engine_id = engine_id
        self._execution_timeout = execution_timeout
        self._restart = restart
        self._startup_timeout = startup_timeout
        self._shutdown_timeout = shutdown_timeout
        self.state = "stopped"
        self.failure: str | None = None
        self.metadata: dict[str, Any] = {}
        self._workers: list[Worker] = []
        self._lock = threading.RLock()  # state, requests, workers
        self._requests = InFlight(self._lock)
        self._send_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._closed = threading.Event()
        self._monitor: threading.Thread | None = None

    # -- what routing and the handle read ---------------------------------------------------

    @property
    def healthy(self) -> bool:
        return self.state in ("stopped", "starting", "ready") and not self._closed.is_set()

    @property
    def in_flight(self) -> int:
        return self._requests.count

    def reserve(self) -> None:
        self._requests.reserve()

    def release(self) -> None:
        self._requests.release()

    def status(self) -> ReplicaStatus:
        with self._lock:
            pids = tuple(w.process.pid or 0 for w in self._workers)
            return ReplicaStatus(
                self.id, self.healthy, self.in_flight, self.devices, pids, self.state, self.failure
            )

    # -- starting ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the workers and wait until each has said hello and ready; a failure leaves no
        process behind and raises ``WorkerFailed`` with the worker's reason."""
        with self._start_lock:
            if self._closed.is_set():
                raise self._closed_error()
            if self.state == "ready":
                return
            if self.state in ("failed", "restarting"):
                raise self.failed_error("start")
            self.state = "starting"
            try:
                self._spawn()
            except EngineError as error:
                self.state, self.failure = "failed", error.message
                raise
            self.state, self.failure = "ready", None

    def _spawn(self) -> None:
        workers, self.metadata = start_workers(
            self._specs, self.id, engine_id=self._engine_id, timeout=self._startup_timeout
        )
        with self._lock:
            closed = self._closed.is_set()
            if not closed:
                self._workers = workers
        if closed:  # closed while they started (a restart, a first request): nobody owns them
            stop_workers(workers, 0.0)
            raise self._closed_error()
        self._monitor = threading.Thread(
            target=self._watch, args=(workers,), name=f"mizuoto-replica-{self.id}", daemon=True
        )
        self._monitor.start()

    # -- requests ----------------------------------------------------------------------------

    def open(self, header: Mapping[str, object], payload: bytes, request: EngineRequest) -> Pending:
        """Send a request to rank 0 and return its channel (the replica starts first if needed)."""
        self.start()
        with self._lock:
            if self.state != "ready":
                raise self.failed_error(str(header.get("capability")))
            pending = self._requests.add(request, str(header.get("capability")))
        self.send("request", {**header, "id": pending.id}, payload, every_rank=True)
        return pending

    def send(
        self,
        kind: str,
        header: Mapping[str, object],
        payload: bytes = b"",
        *,
        every_rank: bool = False,
    ) -> None:
        """Send a frame to rank 0, the output rank (a request: to every rank, in the same order
        on each); a broken pipe fails the replica (its monitor says why).

        The other ranks follow rank 0's decisions about a stream (go on, stop) through their
        own collectives, so ``next``, ``cancel`` and ``close`` go to rank 0 only.
        """
        data = encode(kind, header, payload)
        try:
            with self._send_lock:
                for worker in self._workers if every_rank else self._workers[:1]:
                    worker.connection.send_bytes(data)
        except (OSError, ValueError, IndexError):
            self.fail(f"its pipe closed (sending {kind})")

    def ask_next(self, pending: Pending) -> None:
        """The caller asks for the next chunk of a stream: the worker may compute one more."""
        with self._lock:
            pending.allowed += 1
            if pending.busy_since is None and pending.received <= pending.allowed:
                pending.busy_since = time.monotonic()  # execution_timeout counts again
        self.send("next", {"id": pending.id})

    def has_pending(self, pending: Pending) -> bool:
        """Whether ``pending`` is still open (neither answered in full nor failed)."""
        return self._requests.has(pending)

    def finish(self, pending: Pending) -> None:
        self._requests.finish(pending)

    # -- watching ----------------------------------------------------------------------------

    def _watch(self, workers: list[Worker]) -> None:
        connections = {w.connection: w for w in workers}
        sentinels = {w.process.sentinel: w for w in workers}
        while not self._closed.is_set() and self._workers is workers:
            try:
                ready = wait([*connections, *sentinels], timeout=self._tick())
            except OSError:
                break
            for item in ready:
                if item in connections:
                    self._receive(connections[item])
            for item in ready:
                if item in sentinels and self._workers is workers:
                    worker = sentinels[item]
                    worker.process.join(0.1)
                    self.fail(f"worker {worker.rank} exited with code {worker.process.exitcode}")

    def _receive(self, worker: Worker) -> None:
        try:
            frame = decode(worker.connection.recv_bytes())
            request_id = frame.header.get("id")
        except (EOFError, OSError):
            return  # the process is gone or going: its sentinel says how
        except FrameError as error:
            self.fail(f"worker {worker.rank} sent a malformed frame ({error})")
            return
        with self._lock:
            pending = self._requests.get(request_id)
        if pending is None or worker.rank != 0:
            return  # an answer to a request its caller gave up on; only rank 0 answers
        with self._lock:  # is the worker still working for this request?
            if frame.kind == "started":
                pending.busy_since = time.monotonic()
                return
            if frame.kind == "chunk":
                pending.received += 1
                may_go_on = pending.received <= pending.allowed
                pending.busy_since = time.monotonic() if may_go_on else None
            elif frame.kind != "progress":
                pending.busy_since = None
        pending.frames.put(frame)

    def _tick(self) -> float:
        """Forward cancels and enforce execution deadlines; the seconds until the next look."""
        now = time.monotonic()
        pending = self._requests.all()
        wake = CANCEL_INTERVAL if pending else IDLE_INTERVAL
        limit = self._execution_timeout
        for item in self._requests.cancels_due(pending):
            self.send("cancel", {"id": item.id})
        for item in pending:
            if limit is not None and item.busy_since is not None:
                left = item.busy_since + limit - now
                if left < 0:
                    self.fail(
                        f"a {item.capability} request ran past execution_timeout ({limit:g} s)"
                    )
                    return 0.0
                wake = min(wake, left + 0.001)
        return wake

    # -- failing and closing -----------------------------------------------------------------

    def fail(self, reason: str) -> None:
        """Mark the replica failed: stop its workers, fail its in-flight requests (``detail``:
        the replica, ``during`` the capability each was running, and the reason), and (with
        ``restart = on_failure``) start it again in the background."""
        with self._lock:
            if self.state != "ready":
                return
            self.state, self.failure = "failed", reason
            workers, self._workers = self._workers, []
            pending = self._requests.take_all()
        log.warning("%s replica %d failed: %s", self._engine_id, self.id, reason)
        for item in pending:
            item.frames.put(
                WorkerFailed(
                    f"{self._engine_id}: replica {self.id} failed: {reason}",
                    {
                        "engine": self._engine_id,
                        "replica": self.id,
                        "during": item.capability,
                        "reason": reason,
                    },
                )
            )
        stop_workers(workers, 0.0)
        if self._restart == "on_failure" and not self._closed.is_set():
            self.state = "restarting"
            threading.Thread(
                target=self._heal, name=f"mizuoto-restart-{self.id}", daemon=True
            ).start()

    def _heal(self) -> None:
        for attempt in range(1_000_000):
            delay = RESTART_DELAYS[min(attempt, len(RESTART_DELAYS) - 1)]
            if self._closed.wait(delay):
                return
            with self._start_lock:
                if self._closed.is_set():
                    return
                try:
                    self._spawn()
                except EngineError as error:
                    log.warning(
                        "%s replica %d: restart failed: %s", self._engine_id, self.id, error
                    )
                    continue
                with self._lock:
                    self.state, self.failure = "ready", None
                log.info("%s replica %d restarted", self._engine_id, self.id)
                return

    def close(self) -> None:
        """Stop the workers (ask, wait, terminate, kill); in-flight requests fail with
        ``engine_unavailable``. Idempotent."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            workers, self._workers = self._workers, []
            pending = self._requests.take_all()
            self.state = "stopped"
        for item in pending:
            item.frames.put(self._closed_error())
        for worker in workers:
            try:
                with self._send_lock:
                    worker.connection.send_bytes(encode("shutdown", {}))
            except (OSError, ValueError):
                pass
        stop_workers(workers, self._shutdown_timeout)
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join()

    def _closed_error(self) -> EngineUnavailable:
        return EngineUnavailable(
            f"{self._engine_id}: the model was closed",
            {"engine": self._engine_id, "reason": "closed"},
        )

    def failed_error(self, during: str) -> WorkerFailed:
        return WorkerFailed(
            f"{self._engine_id}: replica {self.id} failed: {self.failure}",
            {
                "engine": self._engine_id,
                "replica": self.id,
                "during": during,
                "reason": self.failure,
            },
        )
