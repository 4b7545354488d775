"""Child processes that stop with the call: killed with their group and reaped on cancel, timeout
or close, directly and through the host."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.process import kill_children, open_process, run_process
from mizuoto_sdk import CancelledError, OperationTimeoutError
from mizuoto_sdk.host import Discovery, EngineRequest, RuntimeService

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")

FIXTURE_SITE = Path(__file__).parent / "fixture_site"
BOUND = 5.0  # seconds: far below the children's 30 s, far above a kill on a loaded machine


def assert_reaped(pid: int) -> None:
    """``pid`` is no longer our child: neither running nor a zombie left to reap."""
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def assert_exits(pid: int) -> None:
    """``pid`` (not our child) exits within BOUND: its pidfd becomes readable when it does."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        readable, _, _ = select.select([pidfd], [], [], BOUND)
    finally:
        os.close(pidfd)
    assert readable, f"process {pid} is still alive after {BOUND} s"


def test_a_cancel_from_another_thread_kills_the_child_and_its_group():
    ctx = RequestContext()
    script = "sleep 30 & echo $$ $!; wait"
    started = time.perf_counter()
    opened = open_process(ctx, ["sh", "-c", script], stdout=subprocess.PIPE, text=True)
    with pytest.raises(CancelledError), opened as child:
        leader, grandchild = map(int, child.stdout.readline().split())
        threading.Thread(target=ctx.cancel).start()
        child.wait()  # returns once the kill lands
    assert time.perf_counter() - started < BOUND
    assert child.returncode == -9
    assert_reaped(leader)
    if hasattr(os, "pidfd_open"):
        assert_exits(grandchild)


def test_run_process_blocking_in_the_child_is_stopped_by_a_timeout():
    ctx = RequestContext()
    ready, writer = os.pipe()
    stopper = threading.Thread(target=lambda: (os.read(ready, 16), ctx.cancel("timeout")))
    stopper.start()
    child = f"import os, time; os.write({writer}, b'ready'); time.sleep(30)"
    started = time.perf_counter()
    try:
        with pytest.raises(OperationTimeoutError):
            run_process(ctx, [sys.executable, "-c", child], pass_fds=(writer,))
    finally:
        os.close(writer)  # the stopper sees the end of the pipe, should the child never write
        stopper.join()
        os.close(ready)
    assert time.perf_counter() - started < BOUND


def test_run_process_returns_what_the_child_printed_and_checks_its_status():
    ctx = RequestContext()
    done = run_process(
        ctx, ["sh", "-c", "cat; echo err >&2"], input="in", capture_output=True, text=True
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "in", "err\n")
    with pytest.raises(subprocess.CalledProcessError) as caught:
        ctx.run_process(["sh", "-c", "exit 3"], check=True)
    assert caught.value.returncode == 3


def test_leaving_the_block_early_kills_and_reaps_the_child():
    ctx = RequestContext()
    started = time.perf_counter()
    with pytest.raises(ValueError), open_process(ctx, ["sleep", "30"]) as child:
        raise ValueError("the engine failed while the child ran")
    assert time.perf_counter() - started < BOUND
    assert child.returncode == -9
    assert_reaped(child.pid)
    assert not ctx.cancelled


def test_closing_a_generator_that_streams_a_child_kills_it():
    ctx = RequestContext()

    def lines():
        with ctx.open_process(["yes", "1"], stdout=subprocess.PIPE) as child:
            yield child
            # not yield from, whose close() would close the pipe before the kill
            for line in child.stdout:  # noqa: UP028
                yield line

    stream = lines()
    child = next(stream)
    assert next(stream) == b"1\n"
    stream.close()
    assert child.returncode == -9
    assert_reaped(child.pid)


def test_an_already_cancelled_call_starts_no_child():
    ctx = RequestContext()
    ctx.cancel("timeout")
    with pytest.raises(OperationTimeoutError), open_process(ctx, ["sleep", "30"]):
        pytest.fail("the block ran")


def test_the_process_group_settings_are_refused():
    opened = open_process(RequestContext(), ["true"], start_new_session=False)
    with pytest.raises(TypeError, match="start_new_session"), opened:
        pass


@pytest.fixture
def fixture_engine(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURE_SITE))
    discovery = Discovery(path=[str(FIXTURE_SITE)], selection={"mizuoto-fixture-process"})
    module = __import__("mizuoto_fixture_process")
    service = RuntimeService(discovery=discovery)
    return service.load("process", "a"), module.STARTED


def test_a_host_timeout_kills_a_child_the_engine_waits_on(fixture_engine):
    handle, started_pids = fixture_engine
    before = len(started_pids)
    started = time.perf_counter()
    with pytest.raises(OperationTimeoutError) as caught:
        handle.call("sleep", {}, EngineRequest(timeout=0.2))
    assert time.perf_counter() - started < 0.2 + BOUND
    assert caught.value.code == "operation_timeout"
    (pid,) = started_pids[before:]
    assert_reaped(pid)


def test_a_host_call_runs_a_child_to_its_end(fixture_engine):
    handle, _ = fixture_engine
    assert handle.call("run", {"args": ["echo", "hi"]}) == {"returncode": 0, "stdout": "hi\n"}


def test_closing_a_host_stream_kills_the_engines_child(fixture_engine):
    handle, started_pids = fixture_engine
    before = len(started_pids)
    stream = handle.synthesize("-32768")
    first = next(stream)
    # The engine yields int16 PCM; the caller gets float32 at the usual scale.
    np.testing.assert_array_equal(first.samples, np.full(4, -1.0, np.float32))
    stream.close()
    (pid,) = started_pids[before:]
    assert_reaped(pid)


def test_cancelling_a_host_stream_kills_the_engines_child(fixture_engine):
    handle, started_pids = fixture_engine
    before = len(started_pids)
    request = EngineRequest()
    stream = handle.synthesize("5", request)
    next(stream)
    request.cancel()
    with pytest.raises(CancelledError):
        for _ in stream:
            pass
    (pid,) = started_pids[before:]
    assert_reaped(pid)


_OWNER = """
import sys, threading, time
from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.process import open_process

held = []

def start():
    held.append(open_process(RequestContext(), ["sleep", "60"]))
    print(held[0].__enter__().pid, flush=True)  # never left: only the owner's death ends it

starter = threading.Thread(target=start)
starter.start()
starter.join()  # the thread that asked for the child is gone; the child must not be
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal")
def test_a_child_outlives_the_thread_that_started_it_but_not_its_owner():
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(owner.stdout.readline())
        assert owner.stdout.readline() == "ready\n"
        os.kill(pid, 0)  # alive: the starting thread's end did not kill it
        owner.kill()  # SIGKILL: no handler of the owner's runs
        owner.wait()
        assert_exits(pid)
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()


def test_kill_children_kills_every_child_still_running():
    ctx = RequestContext()
    with open_process(ctx, ["sleep", "30"]) as first, open_process(ctx, ["sleep", "30"]) as second:
        assert kill_children() >= 2
        assert first.wait(BOUND) == -9
        assert second.wait(BOUND) == -9
    assert kill_children() == 0  # reaped children are no longer anyone's to kill


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_process_starts_children_of_its_own_and_kills_none_of_its_parents():
    ctx = RequestContext()
    with open_process(ctx, ["sleep", "30"]) as held:  # the spawner runs, a child is ours
        pid = os.fork()
        if pid == 0:  # the fork: no spawner thread, none of the parent's children
            code = 1
            try:
                killed = kill_children()
                done = run_process(RequestContext(), ["true"])
                code = 0 if (killed, done.returncode) == (0, 0) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert held.poll() is None  # the parent's child was left alone
