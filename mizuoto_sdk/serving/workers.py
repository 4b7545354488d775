"""One replica run by worker processes: its requests, its monitor, and a failure that stays its own.

Each replica has its own supervisor (``ProcessReplica``), so a crash, a malformed frame or an
execution timeout in one replica fails that replica's requests and no other's. Starting and
stopping the processes themselves is ``serving.processes``.

A request's own cancel and timeout free its caller whatever the worker does: a worker that has
not answered a stopped request ``stop_timeout`` seconds later (it hangs deaf to cancel, or was
stopped with SIGSTOP) fails its replica, and that caller gets CancelledError or
OperationTimeoutError. Closing tells each worker to stop its calls within the same bound and
then kills what is left; a start in progress ends at once.
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
from mizuoto_sdk.serving.processes import (
    Startup,
    Worker,
    WorkerSpec,
    start_workers,
    stop_workers,
)
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
EXIT_MARGIN = 2.0
"""Seconds a stopping worker gets beyond its stop timeout to close its model and exit."""
EXIT_STATUS_WAIT = 1.0
"""Seconds a broken pipe waits for its process's exit status, which says why it broke."""


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
        start_timeout: float = 600.0,
        stop_timeout: float = 10.0,
    ) -> None:
        """``start_timeout``: seconds for every worker to load and say ready
        (``engines.<id>.start_timeout``); ``stop_timeout``: seconds a stopped request or a
        stopping worker gets to unwind (``host.stop_timeout``)."""
        self.id = replica_id
        self.devices = tuple(spec.device for spec in specs)
        self._specs = tuple(specs)
        self._engine_id = engine_id
        self._execution_timeout = execution_timeout
        self._restart = restart
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self.state = "stopped"
        self.failure: str | None = None
        self.metadata: dict[str, Any] = {}
        self._workers: list[Worker] = []
        self._lock = threading.RLock()  # state, requests, workers
        self._requests = InFlight(self._lock)
        self._send_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._closed = threading.Event()
        self._stopped = threading.Event()  # close has stopped the workers
        self._startup: Startup | None = None  # a start in progress, which close ends
        self._exit_by = 0.0  # once closed: when the monitor stops the workers still running
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
                with self._lock:
                    if not self._closed.is_set():
                        self.state, self.failure = "failed", error.message
                raise
            with self._lock:
                if not self._closed.is_set():
                    self.state, self.failure = "ready", None

    def _spawn(self) -> None:
        startup = Startup()
        with self._lock:
            if self._closed.is_set():
                raise self._closed_error()
            self._startup = startup
        try:
            workers, metadata = start_workers(
                self._specs,
                self.id,
                engine_id=self._engine_id,
                timeout=self._start_timeout,
                startup=startup,
            )
        except EngineError:
            if startup.cancelled:  # close ended the start
                raise self._closed_error() from None
            raise
        finally:
            with self._lock:
                self._startup = None
        with self._lock:  # the workers and the monitor that owns their pipes, together
            closed = self._closed.is_set()
            if not closed:
                self._workers, self.metadata = workers, metadata
                self._monitor = threading.Thread(
                    target=self._watch,
                    args=(workers,),
                    name=f"mizuoto-replica-{self.id}",
                    daemon=True,
                )
                self._monitor.start()
        if closed:  # closed while they started (a restart, a first request): nobody owns them
            stop_workers(workers, 0.0)
            raise self._closed_error()

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
        on each); a broken pipe fails the replica.

        The other ranks follow rank 0's decisions about a stream (go on, stop) through their
        own collectives, so ``next``, ``cancel`` and ``close`` go to rank 0 only.
        """
        self._send(encode(kind, header, payload), kind, every_rank=every_rank)

    def _send(self, data: bytes, kind: str, *, every_rank: bool = False, wait: float = -1) -> bool:
        """``send``; ``wait``: seconds to wait for a send in progress (which a worker that
        reads nothing keeps stuck); False when it did not end by then."""
        if not self._send_lock.acquire(timeout=wait):
            return False
        worker = None
        try:
            for worker in self._workers if every_rank else self._workers[:1]:
                worker.connection.send_bytes(data)
        except (OSError, ValueError):
            self._send_lock.release()
            self._broken(worker, f"sending {kind}")
            return True
        self._send_lock.release()
        return True

    def _broken(self, worker: Worker | None, doing: str) -> None:
        """A pipe broke: fail the replica, saying how the process ended when it did (a killed
        worker's pipe breaks a moment before its exit status can be read)."""
        ended = None if worker is None else worker.exit_status(EXIT_STATUS_WAIT)
        if worker is not None and ended is not None:
            self.fail(f"worker {worker.rank} {ended}")
        else:
            self.fail(f"its pipe closed ({doing})")

    def ask_next(self, pending: Pending) -> None:
        """The caller asks for the next chunk of a stream: the worker may compute one more."""
        with self._lock:
            pending.allowed += 1
            pending.asked = time.monotonic()
            if pending.busy_since is None and pending.received <= pending.allowed:
                pending.busy_since = pending.asked  # execution_timeout counts again
        self.send("next", {"id": pending.id})

    def has_pending(self, pending: Pending) -> bool:
        """Whether ``pending`` is still open (neither answered in full nor failed)."""
        return self._requests.has(pending)

    def finish(self, pending: Pending) -> None:
        self._requests.finish(pending)

    # -- watching ----------------------------------------------------------------------------

    def _watch(self, workers: list[Worker]) -> None:
        """Read the workers' frames and notice their exits; once the replica is closed, go on
        reading (a worker that stops must never block on a full pipe) until they have exited
        or the time ``close`` gave them is up, then stop what is left."""
        connections = {w.connection: w for w in workers}
        sentinels = {w.process.sentinel: w for w in workers}
        while sentinels:
            closing = self._closed.is_set()
            if closing:
                timeout = min(IDLE_INTERVAL, self._exit_by - time.monotonic())
                if timeout <= 0:
                    break
            elif self._workers is not workers:
                return  # the replica failed, which stopped them
            else:
                timeout = self._tick()
            try:
                ready = wait([*connections, *sentinels], timeout=timeout)
            except OSError:
                break
            for item in ready:
                if item in connections and not self._receive(connections[item]):
                    del connections[item]  # its end: the process's sentinel says how
            for item in ready:
                if item in sentinels:
                    worker = sentinels.pop(item)
                    if not closing and self._workers is workers:
                        ended = worker.exit_status(EXIT_STATUS_WAIT)
                        self.fail(f"worker {worker.rank} {ended or 'ended'}")
        if self._closed.is_set():
            stop_workers(workers, 0.0)

    def _receive(self, worker: Worker) -> bool:
        """Take one frame from ``worker`` to the request it answers; False at the pipe's end."""
        try:
            frame = decode(worker.connection.recv_bytes())
            request_id = frame.header.get("id")
        except (EOFError, OSError):
            return False
        except FrameError as error:
            self.fail(f"worker {worker.rank} sent a malformed frame ({error})")
            return True
        with self._lock:
            pending = self._requests.get(request_id)
        if pending is None or worker.rank != 0:
            return True  # an answer to a request its caller gave up on; only rank 0 answers
        with self._lock:  # is the worker still working for this request?
            if frame.kind == "started":
                pending.busy_since = time.monotonic()
                return True
            if frame.kind == "chunk":
                pending.received += 1
                may_go_on = pending.received <= pending.allowed
                pending.busy_since = time.monotonic() if may_go_on else None
            elif frame.kind != "progress":
                pending.busy_since = None
                pending.answered = frame.kind in ("end", "result", "error")
        pending.frames.put(frame)
        return True

    def _tick(self) -> float:
        """Forward cancels, free the callers of stopped requests the worker does not answer,
        and enforce execution deadlines; the seconds until the next look."""
        now = time.monotonic()
        pending = self._requests.all()
        wake = CANCEL_INTERVAL if pending else IDLE_INTERVAL
        limit = self._execution_timeout
        for item in self._requests.cancels_due(pending):
            if not self._send(encode("cancel", {"id": item.id}), "cancel", wait=CANCEL_INTERVAL):
                item.cancel_sent = False  # a send is stuck (the worker reads nothing): later
        unanswered = self._requests.unanswered(pending, self._stop_timeout)
        if unanswered:
            why = f"the worker did not answer within {self._stop_timeout:g} s (host.stop_timeout)"
            self.fail(
                f"a {unanswered[0].capability} request was stopped and {why}",
                {item.id: item.stop_error(why) for item in unanswered},
            )
            return 0.0
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

    def fail(self, reason: str, errors: Mapping[int, EngineError] | None = None) -> None:
        """Mark the replica failed: stop its workers, fail its in-flight requests (``detail``:
        the replica, ``during`` the capability each was running, and the reason; a request
        in ``errors`` gets its own), and (with ``restart = on_failure``) start it again in the
        background."""
        with self._lock:
            if self.state != "ready":
                return
            self.state, self.failure = "failed", reason
            workers, self._workers = self._workers, []
            pending = self._requests.take_all()
        log.warning("%s replica %d failed: %s", self._engine_id, self.id, reason)
        for item in pending:
            if errors and item.id in errors:
                item.frames.put(errors[item.id])
                continue
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
                    if not self._closed.is_set():
                        self.state, self.failure = "ready", None
                log.info("%s replica %d restarted", self._engine_id, self.id)
                return

    def close(self) -> None:
        """Stop the workers: each is told to stop its calls within ``stop_timeout`` seconds
        and exit, and what is left then is killed; a start in progress ends at once, its
        workers killed. In-flight requests fail with ``engine_unavailable``. Idempotent; a
        second close returns once the first has stopped the workers."""
        with self._lock:
            if self._closed.is_set():
                closing = True
            else:
                closing = False
                self._exit_by = time.monotonic() + self._stop_timeout + EXIT_MARGIN
                self._closed.set()
                workers, self._workers = self._workers, []
                monitor = self._monitor if workers else None  # it owns their pipes
                pending = self._requests.take_all()
                startup = self._startup
                self.state = "stopped"
        if closing:
            self._stopped.wait()
            return
        try:
            if startup is not None:
                startup.cancel()
            for item in pending:
                item.frames.put(self._closed_error())
            for worker in workers:
                if not self._tell_shutdown(worker):
                    worker.process.kill()  # it cannot hear the shutdown: nothing to wait for
            if monitor is not None and monitor is not threading.current_thread():
                monitor.join()  # it waits for their exit until _exit_by, then stops the rest
            stop_workers(workers, max(0.0, self._exit_by - time.monotonic()))  # had it none
        finally:
            self._stopped.set()

    def _tell_shutdown(self, worker: Worker) -> bool:
        """Ask ``worker`` to stop; False when it cannot hear it (its pipe is broken, or a send
        stuck on it because it reads nothing)."""
        if not self._send_lock.acquire(timeout=CANCEL_INTERVAL):
            return False
        try:
            worker.connection.send_bytes(encode("shutdown", {"grace": self._stop_timeout}))
        except (OSError, ValueError):
            return False
        finally:
            self._send_lock.release()
        return True

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
