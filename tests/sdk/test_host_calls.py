"""Cancel, timeout and error mapping on the host's calls."""

from __future__ import annotations

import threading
import time

import pytest

from mizuoto_sdk import CancelledError, EngineError, OperationTimeoutError
from mizuoto_sdk.host import EngineRequest, RuntimeService

BOUND = 0.5  # seconds: a 20 ms watcher and a 5 ms engine step stop far sooner


@pytest.fixture
def service(host_engine):
    return RuntimeService(discovery=host_engine.discovery)


@pytest.fixture
def handle(service, host_engine):
    return service.load(host_engine.engine_id, "a")


def watchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("mizuoto-watch")]


def test_cancel_from_another_thread_stops_the_stream_within_the_bound(host_engine, handle):
    request = EngineRequest(params={"mode": "slow", "chunks": 100_000})
    stream = handle.synthesize("hello", request)
    next(stream)
    timer = threading.Timer(0.1, request.cancel)
    started = time.perf_counter()
    timer.start()
    with pytest.raises(CancelledError) as caught:
        for _ in stream:
            pass
    elapsed = time.perf_counter() - started
    assert elapsed < 0.1 + BOUND
    assert caught.value.code == "cancelled"
    assert caught.value.detail["engine"] == "hosted"
    assert ("finally", "slow") in host_engine.events
    assert handle.engine.state == "ready"
    assert watchers() == []


def test_a_timeout_raises_operation_timeout(handle):
    request = EngineRequest(params={"mode": "slow", "chunks": 100_000}, timeout=0.15)
    started = time.perf_counter()
    with pytest.raises(OperationTimeoutError) as caught:
        list(handle.synthesize("hello", request))
    assert 0.15 <= time.perf_counter() - started < 0.15 + BOUND
    assert caught.value.code == "operation_timeout"
    assert request.timings["total"] >= 0.15


def test_the_host_stops_an_engine_that_never_checks_cancel_between_chunks(handle):
    request = EngineRequest(params={"mode": "ignore_cancel", "chunks": 1000})
    stream = handle.synthesize("hello", request)
    next(stream)
    request.cancel()
    with pytest.raises(CancelledError):
        for _ in stream:
            pass


def test_a_non_streaming_call_is_cancelled_too(handle):
    request = EngineRequest(timeout=0.1)
    with pytest.raises(OperationTimeoutError):
        handle.call("sleep", {}, request)
    assert watchers() == []


def test_an_engine_error_keeps_its_code_and_gains_engine_and_device(handle):
    with pytest.raises(EngineError) as caught:
        list(handle.synthesize("hello", EngineRequest(params={"mode": "invalid"})))
    error = caught.value
    assert error.code == "invalid_request"
    assert error.detail == {"field": "params.mode", "engine": "hosted", "device": "cpu"}


def test_any_other_exception_becomes_engine_error_with_name_and_traceback(handle):
    with pytest.raises(EngineError) as caught:
        list(handle.synthesize("hello", EngineRequest(params={"mode": "raise"})))
    error = caught.value
    assert error.code == "engine_error"
    assert error.detail["exception"] == "ValueError"
    assert "broken on purpose" in error.detail["traceback"]
    assert isinstance(error.__cause__, ValueError)


def test_engine_code_that_calls_sys_exit_is_an_engine_error_and_the_host_goes_on(
    service, host_engine, handle
):
    with pytest.raises(EngineError) as caught:
        list(handle.synthesize("hello", EngineRequest(params={"mode": "exit"})))
    assert caught.value.code == "engine_error"
    assert caught.value.detail["exception"] == "SystemExit"
    with pytest.raises(EngineError) as caught:
        service.load(host_engine.engine_id, "b", options={"exit_load": True})
    assert caught.value.code == "engine_error"
    assert caught.value.detail["exception"] == "SystemExit"
    assert len(list(handle.synthesize("hello"))) == 3  # the host still serves


def test_an_engine_whose_constructor_fails_is_unavailable_with_the_reason(
    service, host_engine, monkeypatch
):
    def broken(self):
        raise ValueError("no licence file")

    monkeypatch.setattr(host_engine.module.HostEngine, "__init__", broken)
    with pytest.raises(EngineError) as caught:
        service.load(host_engine.engine_id, "a")
    assert caught.value.code == "engine_unavailable"
    assert "no licence file" in str(caught.value)
    assert caught.value.detail["exception"] == "ValueError"
    assert service.engine(host_engine.engine_id).state == "crashed"


def test_a_cancel_ends_a_fast_stream_at_its_next_chunk_without_waiting_for_the_watcher(handle):
    request = EngineRequest(params={"chunks": 1000})
    stream = handle.synthesize("hello", request)
    next(stream)
    request.cancel()
    with pytest.raises(CancelledError):
        next(stream)


def test_out_of_memory_releases_idle_models_on_the_device_and_is_compute_unavailable(
    service, host_engine, handle
):
    idle = service.load(host_engine.engine_id, "b")
    with pytest.raises(EngineError) as caught:
        list(handle.synthesize("hello", EngineRequest(params={"mode": "oom"})))
    error = caught.value
    assert error.code == "compute_unavailable"
    assert error.detail["reason"] == "out_of_memory"
    assert error.detail["released"] == [idle.name]
    assert [h.spec.model_id for h in service.models()] == ["a"]  # the failing one stays


def test_a_failing_load_is_mapped_and_leaves_nothing_loaded(service, host_engine):
    with pytest.raises(EngineError) as caught:
        service.load(host_engine.engine_id, "a", options={"fail_load": True})
    assert caught.value.code == "engine_error"
    assert "load failed on purpose" in caught.value.detail["traceback"]
    assert service.engine(host_engine.engine_id).state == "stopped"


def test_an_unknown_model_or_dtype_is_an_invalid_request(service, host_engine):
    with pytest.raises(EngineError) as caught:
        service.load(host_engine.engine_id, "zzz")
    assert caught.value.detail["field"] == "model" and "known models: a, b, c" in str(caught.value)
    with pytest.raises(EngineError) as caught:
        service.load(host_engine.engine_id, dtype="bf16")
    assert caught.value.detail["field"] == "dtype"
    with pytest.raises(EngineError) as caught:
        service.engine(host_engine.engine_id, "cuda:0")
    assert caught.value.detail["field"] == "device"
