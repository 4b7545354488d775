"""A host's stop ends the calls in flight within its bounded time: engines' ``finally`` blocks
run, their children die, callers get CancelledError, and a call no cancel reaches is named."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from mizuoto_sdk import CancelledError
from mizuoto_sdk.host import Discovery, RuntimeService

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")

FIXTURE_SITE = Path(__file__).parents[1] / "runtime" / "fixture_site"
BOUND = 5.0  # seconds: far above a stop on a loaded machine, far below the children's 30 s


@pytest.fixture
def process_engine(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURE_SITE))
    discovery = Discovery(path=[str(FIXTURE_SITE)], selection={"mizuoto-fixture-process"})
    module = __import__("mizuoto_fixture_process")
    module.HOLDING.clear()
    module.RELEASE.clear()
    service = RuntimeService(discovery=discovery)
    yield service, module
    module.RELEASE.set()
    service.close(grace=0)


def _reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_a_stop_closes_a_stream_paused_between_chunks(process_engine):
    service, module = process_engine
    stream = service.load("process", "a").synthesize("7")
    next(stream)  # the engine now waits for the caller, who never asks again
    pid = module.STARTED[-1]
    started = time.monotonic()
    assert service.close(grace=BOUND) == []
    assert time.monotonic() - started < BOUND
    assert "7" in module.ENDED  # the engine's finally ran, on the stop
    assert _reaped(pid)  # and its child is gone, reaped
    with pytest.raises(CancelledError):
        next(stream)  # the caller, coming back, learns why


def test_a_stop_cancels_a_call_blocked_on_its_child(process_engine):
    service, module = process_engine
    model = service.load("process", "a")
    before = len(module.STARTED)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            model.call("sleep", {})
        except BaseException as error:
            errors.append(error)

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + BOUND
    while len(module.STARTED) == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(module.STARTED) > before, "the engine never started its child"
    started = time.monotonic()
    assert service.close(grace=BOUND) == []
    assert time.monotonic() - started < BOUND
    caller.join(BOUND)
    assert [type(e) for e in errors] == [CancelledError]
    assert _reaped(module.STARTED[-1])


def test_a_call_that_never_checks_is_named_and_the_stop_ends_in_time(process_engine):
    service, module = process_engine
    model = service.load("process", "a")
    ended: list[BaseException] = []

    def call() -> None:
        try:
            model.call("hold", {})
        except CancelledError as error:  # it returned, past the stop: the caller hears why
            ended.append(error)

    caller = threading.Thread(target=call)
    caller.start()
    assert module.HOLDING.wait(BOUND)
    started = time.monotonic()
    assert service.close(grace=0.3) == [model.name]
    assert time.monotonic() - started < BOUND
    module.RELEASE.set()
    caller.join(BOUND)
    assert [type(e) for e in ended] == [CancelledError]
