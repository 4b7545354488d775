"""Failures of local replicas stay inside their replica: real worker processes on CPU, the faulty
fixture engine failing on request, and short timeouts. A worker that dies, hangs past
``execution_timeout`` or sends a malformed frame fails its replica's requests with
``worker_failed`` while the other replica keeps serving; an engine's request error reaches the
caller with its own code and leaves the replica healthy; ``restart = on_failure`` heals.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from serving_support import (
    CORRUPT_SEED,
    CORRUPTING,
    SITE,
    faulty_service,
    process_state,
    running,
    spawned_children,
    wait_until,
    worker_pids,
)

from mizuoto_sdk import (
    CancelledError,
    EngineError,
    EngineUnavailable,
    InvalidRequest,
    OperationTimeoutError,
    WorkerFailed,
)
from mizuoto_sdk.host import EngineRequest

EXECUTION_TIMEOUT = 1.5
STOP_TIMEOUT = 1.0  # host.stop_timeout: how long a stopped request's worker has to answer
BOUND = 1.0  # seconds: the supervisor looks every 20 ms; the worker sees cancel within 50 ms
HEAL = 15.0  # seconds for a restart: 0.5 s backoff and a spawn, on a busy machine
START = 30.0  # seconds for a worker to start on a busy machine
STOPPED = 5.0  # seconds for close to kill a starting worker and its start to end, on a busy one


@pytest.fixture(scope="module")
def site():
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(SITE))
        yield


@pytest.fixture(scope="module")
def served(site):
    settings = {
        "engines.faulty.replicas": 2,
        "engines.faulty.restart": "on_failure",
        "engines.faulty.execution_timeout": EXECUTION_TIMEOUT,
    }
    with faulty_service(settings, worker=CORRUPTING) as service:
        yield service.load("faulty").start()


@pytest.fixture
def pair(served):
    """The shared two replicas, both ready (a replica failed by the test before has healed)."""
    wait_until(lambda: all(r.state == "ready" for r in served.replicas), HEAL, "both ready")
    return served


def replica_of(model, pid):
    (replica,) = [r.id for r in model.replicas if pid in r.pids]
    return replica


def serves_with(model, pids):
    """Two calls in a row (round robin on ties) reach exactly ``pids``."""
    return {model.call("pid")["pid"] for _ in range(2)} == set(pids)


# Startup first: these check that no new child process is left, so nothing else may be starting.
@pytest.mark.parametrize(
    ("fault", "why"), [("exit", "exited with code 5 before ready"), ("raise", "load failed")]
)
def test_a_worker_failing_at_startup_fails_start_and_leaves_no_process(site, fault, why):
    before = spawned_children()
    with faulty_service({"engines.faulty.replicas": 2}) as service:
        model = service.load("faulty", options={"fault_on_load": fault})
        with pytest.raises(WorkerFailed, match=why) as caught:
            model.start()
        assert caught.value.code == "worker_failed"
        assert caught.value.detail["during"] == "startup"
        assert caught.value.detail["replica"] in (0, 1)
        assert model.closed and spawned_children() <= before
        with pytest.raises(EngineUnavailable):
            model.call("pid")


def test_a_worker_hung_in_load_fails_start_at_its_start_timeout(site):
    settings = {"engines.faulty.deployment": "local", "engines.faulty.start_timeout": 1.0}
    before = spawned_children()
    with faulty_service(settings) as service:
        model = service.load("faulty", options={"load_delay": 600})
        started = time.monotonic()
        with pytest.raises(WorkerFailed) as caught:
            model.start()
        assert 1.0 <= time.monotonic() - started < 1.0 + START
        assert "sent no ready within 1 s (engines.faulty.start_timeout)" in caught.value.message
        assert caught.value.detail["during"] == "startup"
        assert model.closed
    wait_until(lambda: spawned_children() <= before, 5, "its worker stopped and reaped")


def test_close_ends_a_start_in_progress_and_kills_its_worker(site):
    before = spawned_children()
    with faulty_service({"engines.faulty.deployment": "local"}) as service:
        model = service.load("faulty", options={"load_delay": 600})  # start_timeout: 600 s
        failures = []

        def start():
            try:
                model.start()
            except EngineUnavailable as error:
                failures.append(error)

        starter = threading.Thread(target=start, daemon=True)
        starter.start()
        (pid,) = wait_until(lambda: spawned_children() - before, START, "its worker spawned")
        closing = time.monotonic()
        model.close()
        starter.join(STOPPED)
        assert not starter.is_alive() and time.monotonic() - closing < STOPPED
    assert [f.detail["reason"] for f in failures] == ["closed"]
    assert process_state(pid) is None  # killed and reaped
    assert [r.state for r in model.replicas] == ["stopped"]


def test_sigkill_mid_stream_fails_that_stream_while_the_other_replica_serves(pair):
    stream = pair.synthesize("hi", EngineRequest(params={"fault": "hang", "at": 1}))
    pid = next(stream).metadata["pid"]
    replica = replica_of(pair, pid)
    (other,) = [p for p in worker_pids(pair) if p != pid]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    with pytest.raises(WorkerFailed) as caught:
        next(stream)
    assert time.monotonic() - killed < BOUND
    assert caught.value.code == "worker_failed"
    detail = caught.value.detail
    assert (detail["replica"], detail["during"]) == (replica, "synthesize")
    # whichever noticed first, the pipe or the process's end, the reason is the kill
    assert detail["reason"] == f"worker 0 was killed by SIGKILL (code {-signal.SIGKILL})"
    assert not pair.replicas[replica].healthy
    chunks = list(pair.synthesize("hi", EngineRequest(params={"chunks": 2})))
    assert {c.metadata["pid"] for c in chunks} == {other}
    assert pair.call("pid") == {"pid": other}


def test_restart_on_failure_brings_the_replica_back(pair):
    old = pair.replicas[1].pids
    os.kill(old[0], signal.SIGKILL)
    down = wait_until(lambda: (r := pair.replicas[1]).pids != old and r, HEAL, "replica 1 down")
    assert (down.state, down.healthy) == ("restarting", False)  # 0.5 s before it starts again
    healed = wait_until(
        lambda: (r := pair.replicas[1]).state == "ready" and r, HEAL, "replica 1 restarted"
    )
    assert healed.healthy and healed.failure is None
    assert healed.pids != old and running(healed.pids[0])
    assert serves_with(pair, worker_pids(pair))


def test_execution_timeout_fails_a_hung_replica_and_leaves_the_other_healthy(pair):
    started = time.monotonic()
    with pytest.raises(WorkerFailed) as caught:
        list(pair.synthesize("hi", EngineRequest(params={"fault": "hang", "at": 0})))
    assert EXECUTION_TIMEOUT <= time.monotonic() - started < EXECUTION_TIMEOUT + BOUND
    detail = caught.value.detail
    assert detail["during"] == "synthesize" and "execution_timeout" in detail["reason"]
    healthy = [r for r in pair.replicas if r.healthy]
    assert [r.id for r in healthy] == [1 - detail["replica"]]
    assert pair.call("pid") == {"pid": healthy[0].pids[0]}


def test_an_engine_request_error_reaches_the_caller_and_the_replica_stays(pair):
    before = pair.replicas
    stream = pair.synthesize("hi", EngineRequest(params={"fault": "invalid", "at": 1}))
    pid = next(stream).metadata["pid"]
    with pytest.raises(InvalidRequest) as caught:
        next(stream)
    assert (caught.value.code, caught.value.detail["field"]) == ("invalid_request", "text")
    with pytest.raises(EngineError, match="crashed on purpose") as crashed:
        pair.collect("synthesize", "hi", request=EngineRequest(params={"fault": "crash"}))
    assert crashed.value.code == "engine_error"
    assert pair.replicas == before
    assert pid in worker_pids(pair) and serves_with(pair, worker_pids(pair))


def test_cancel_and_the_request_timeout_reach_the_worker(pair):
    before = pair.replicas
    request = EngineRequest(params={"fault": "hang_cancellable", "at": 1})
    stream = pair.synthesize("hi", request)
    next(stream)
    request.cancel()
    cancelled = time.monotonic()
    with pytest.raises(CancelledError):
        next(stream)
    assert time.monotonic() - cancelled < BOUND

    started = time.monotonic()
    with pytest.raises(OperationTimeoutError):
        list(
            pair.synthesize("hi", EngineRequest(params={"fault": "hang_cancellable"}, timeout=0.3))
        )
    with pytest.raises(OperationTimeoutError):
        pair.call("sleep", {"seconds": 30}, EngineRequest(timeout=0.3))
    assert time.monotonic() - started < 2 * (0.3 + BOUND)
    assert pair.replicas == before and serves_with(pair, worker_pids(pair))


def test_cancel_and_timeout_free_the_caller_of_a_stopped_worker(site):
    # SIGSTOP: the worker reads nothing and answers nothing; no execution_timeout is set.
    settings = {
        "engines.faulty.deployment": "local",
        "engines.faulty.restart": "on_failure",
        "host.stop_timeout": STOP_TIMEOUT,
    }
    with faulty_service(settings) as service:
        model = service.load("faulty").start()
        request = EngineRequest(params={"fault": "hang_cancellable", "at": 1})
        stream = model.synthesize("hi", request)
        pid = next(stream).metadata["pid"]
        os.kill(pid, signal.SIGSTOP)
        request.cancel()
        cancelled = time.monotonic()
        with pytest.raises(CancelledError) as caught:
            next(stream)
        assert STOP_TIMEOUT <= time.monotonic() - cancelled < STOP_TIMEOUT + BOUND
        assert "host.stop_timeout" in caught.value.message
        (failed,) = model.replicas
        assert not failed.healthy and "did not answer" in failed.failure
        wait_until(lambda: not running(pid), BOUND + 4.0, "the stopped worker killed")

        # The same for the request's own timeout, once the replica has restarted.
        wait_until(lambda: model.replicas[0].state == "ready", HEAL, "restarted")
        (pid,) = worker_pids(model)
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(OperationTimeoutError) as timed_out:
            model.call("sleep", {"seconds": 30}, EngineRequest(timeout=0.5))
        assert 0.5 + STOP_TIMEOUT <= time.monotonic() - started < 0.5 + STOP_TIMEOUT + BOUND
        assert timed_out.value.detail == {"reason": "timeout", "timeout": 0.5}
        wait_until(lambda: not running(pid), BOUND + 4.0, "the stopped worker killed")


@pytest.mark.parametrize("corrupt", ["frame", "kind", "chunk"])
def test_a_malformed_frame_fails_only_its_replica(pair, corrupt):
    pids = worker_pids(pair)
    with pytest.raises(WorkerFailed) as caught:
        if corrupt == "chunk":  # chunk 1's payload is cut short
            list(pair.synthesize("hi", EngineRequest(params={"seed": CORRUPT_SEED})))
        else:
            pair.call("echo", {"corrupt": corrupt})
    detail = caught.value.detail
    assert detail["during"] == ("synthesize" if corrupt == "chunk" else "call")
    failed = pair.replicas[detail["replica"]]
    assert not failed.healthy and failed.failure and pids[detail["replica"]] not in failed.pids
    other = pids[1 - detail["replica"]]
    assert pair.replicas[1 - detail["replica"]].healthy
    assert pair.call("pid") == {"pid": other}
    wait_until(lambda: not running(pids[detail["replica"]]), BOUND, "its worker stopped")


def test_with_restart_never_a_failed_last_replica_leaves_the_model_unavailable(site):
    with faulty_service({"engines.faulty.deployment": "local"}) as service:
        model = service.load("faulty").start()
        (pid,) = worker_pids(model)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: model.replicas[0].state == "failed", 10, "replica 0 failed")
        assert not model.replicas[0].healthy and "code -9" in model.replicas[0].failure
        with pytest.raises(EngineUnavailable) as caught:
            model.call("pid")
        assert caught.value.detail["reason"] == "no_healthy_replica"


def test_close_during_a_restart_leaves_no_process(site):
    settings = {"engines.faulty.deployment": "local", "engines.faulty.restart": "on_failure"}
    with faulty_service(settings) as service:
        model = service.load("faulty", options={"load_delay": 0.5}).start()
        (pid,) = worker_pids(model)
        before = spawned_children()
        os.kill(pid, signal.SIGKILL)
        # the restart's worker has started and is still loading (0.5 s) when the model closes
        (starting,) = wait_until(lambda: spawned_children() - before, HEAL, "restart spawned")
        model.close()
    wait_until(lambda: not running(starting), 5, "the restarted worker stopped")
    assert [r.state for r in model.replicas] == ["stopped"]
    # both of this model's workers are gone and reaped (no zombie left); other tests' shared
    # replicas may be restarting meanwhile, so the check names these two, not all children
    gone = wait_until(
        lambda: process_state(pid) is None and process_state(starting) is None, 5, "reaped"
    )
    assert gone
