"""Serving with real worker processes on CPU, through the host API: a local deployment answers
like the model in this process (bitwise), routes by requests in flight, streams lazily across the
pipe, and closes without leaving a process. Failures are in test_serving_faults.py.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from serving_support import (
    CORRUPTING,
    HERE,
    HOST_SCRIPT,
    SITE,
    chunks_computed,
    faulty_service,
    running,
    stream_report,
    wait_until,
    worker_pids,
)

from mizuoto_sdk import AudioChunk, CancelledError, EngineUnavailable, InvalidRequest
from mizuoto_sdk.discovery import Discovery
from mizuoto_sdk.host import EngineRequest, RuntimeService

ORPHAN_BOUND = 3.0  # seconds: workers poll their parent every 0.5 s and read EOF on their pipe


@pytest.fixture(scope="module")
def site():
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(SITE))
        yield


@pytest.fixture(scope="module")
def inline(site):
    service = faulty_service()
    yield service.load("faulty")
    service.close()


@pytest.fixture(scope="module")
def pair(site):
    """Two local replicas of the faulty engine, run by the host's own worker."""
    with faulty_service({"engines.faulty.replicas": 2}) as service:
        yield service.load("faulty").start()


@pytest.fixture(scope="module")
def single(site):
    """One local replica whose worker reports how many chunks each stream computed."""
    with faulty_service({"engines.faulty.deployment": "local"}, worker=CORRUPTING) as service:
        yield service.load("faulty")


def samples(chunks):
    return [c.samples.tobytes() for c in chunks]


def test_mode_and_replicas_describe_where_the_model_runs(pair, inline):
    assert (pair.mode, inline.mode) == ("local", "inline")
    assert [(r.id, r.healthy, r.in_flight, r.devices, r.state) for r in pair.replicas] == [
        (0, True, 0, ("cpu",), "ready"),
        (1, True, 0, ("cpu",), "ready"),
    ]
    pids = worker_pids(pair)
    assert len(set(pids)) == 2 and all(running(pid) for pid in pids)
    assert [(r.id, r.devices, r.pids) for r in inline.replicas] == [(0, ("cpu",), (os.getpid(),))]


def test_local_replicas_equal_inline_bitwise_for_the_same_seed(pair, inline):
    def run(model):
        request = EngineRequest(params={"seed": 7, "chunks": 3, "chunk_samples": 500})
        return list(model.synthesize("hello", request))

    local, here = run(pair), run(inline)
    assert samples(local) == samples(here)
    assert {c.metadata["pid"] for c in local} <= set(worker_pids(pair))
    assert [c.metadata["index"] for c in local] == [0, 1, 2]
    audio = AudioChunk(np.linspace(-1, 1, 1001, dtype=np.float32), 8_000)
    converted = list(pair.convert(audio, EngineRequest(params={"chunks": 3})))
    assert samples(converted) == samples(inline.convert(audio, EngineRequest(params={"chunks": 3})))
    assert {c.sample_rate for c in converted} == {8_000}
    whole = pair.collect("synthesize", "hello", request=EngineRequest(params={"seed": 7}))
    expected = inline.collect("synthesize", "hello", request=EngineRequest(params={"seed": 7}))
    assert whole.samples.tobytes() == expected.samples.tobytes()


def test_many_threads_at_once_get_what_one_caller_gets_in_turn(pair, inline):
    # 8 threads, 3 requests each, streams and collects mixed, on both replicas at once: every
    # answer equals the same seed's answer from one caller asking in turn, in this process.
    def ask(model, seed):
        request = EngineRequest(params={"seed": seed, "chunks": 3, "chunk_samples": 400})
        if seed % 2:
            return samples(model.synthesize(f"text {seed}", request))
        return [model.collect("synthesize", f"text {seed}", request=request).samples.tobytes()]

    seeds = range(100, 124)
    serial = {seed: ask(inline, seed) for seed in seeds}
    start = threading.Barrier(8)

    def client(mine):
        start.wait()
        return {seed: ask(pair, seed) for seed in mine}

    with ThreadPoolExecutor(8) as pool:
        parts = pool.map(client, [list(seeds)[i::8] for i in range(8)])
    concurrent = {seed: answer for part in parts for seed, answer in part.items()}
    assert concurrent == serial
    assert [r.in_flight for r in pair.replicas] == [0, 0]


def test_submit_futures_resolve_streams_to_chunks_and_calls_to_values(pair, inline, tmp_path):
    request = EngineRequest(params={"seed": 3, "chunks": 2})
    stream = pair.submit("synthesize", "hi", request=request)
    value = pair.submit("call", "echo", {"a": [1, 2]})
    voice = pair.submit("prepare_voice", AudioChunk(np.zeros(10, np.float32), 16_000), tmp_path)
    expected = inline.synthesize("hi", EngineRequest(params={"seed": 3, "chunks": 2}))
    assert samples(stream.result(timeout=30)) == samples(expected)
    assert request.timings["total"] > 0
    assert value.result(timeout=30) == {"a": [1, 2]}
    assert voice.result(timeout=30) == {"samples": 10}
    assert (tmp_path / "voice.json").is_file()


def test_routing_spreads_requests_by_how_many_are_in_flight(pair):
    # Streams that stop before chunk 1 until cancelled: each holds its replica while the next
    # is routed, so the least-in-flight choice alternates.
    requests = [EngineRequest(params={"fault": "hang_cancellable", "at": 1}) for _ in range(4)]
    streams = [pair.synthesize("hi", request) for request in requests]
    firsts = [next(stream) for stream in streams]
    assert sorted(Counter(c.metadata["pid"] for c in firsts).items()) == sorted(
        (pid, 2) for pid in worker_pids(pair)
    )
    assert [r.in_flight for r in pair.replicas] == [2, 2]
    for request in requests:
        request.cancel()
    for stream in streams:
        with pytest.raises(CancelledError):
            next(stream)
    assert [r.in_flight for r in pair.replicas] == [0, 0]

    # The same through submit: four futures in flight at once, two on each replica.
    requests = [EngineRequest(params={"fault": "hang_cancellable"}) for _ in range(4)]
    futures = [pair.submit("synthesize", "hi", request=request) for request in requests]
    wait_until(lambda: sum(r.in_flight for r in pair.replicas) == 4, 10, "4 in flight")
    assert [r.in_flight for r in pair.replicas] == [2, 2]
    for request in requests:
        request.cancel()
    for future in futures:
        with pytest.raises(CancelledError):
            future.result(timeout=10)


def test_streams_stay_lazy_across_the_process_boundary(single):
    # One chunk taken, then the stream closed: the worker computed at most one ahead.
    stream = single.synthesize("hi", EngineRequest(params={"seed": 101, "chunks": 50}))
    next(stream)
    stream.close()
    assert wait_until(lambda: chunks_computed(single, 101), 10, "stream 101 ended") <= 2

    stream = single.synthesize("hi", EngineRequest(params={"seed": 102, "chunks": 50}))
    assert len([next(stream) for _ in range(3)]) == 3
    stream.close()
    assert wait_until(lambda: chunks_computed(single, 102), 10, "stream 102 ended") <= 4

    assert len(list(single.synthesize("hi", EngineRequest(params={"seed": 103, "chunks": 5})))) == 5
    assert chunks_computed(single, 103) == 5


def test_closing_a_stream_stops_the_engine_working_ahead(single):
    # The worker computes chunk 1 ahead, which waits until cancelled; the caller takes chunk 0
    # and closes the stream. Without a cancel the worker's thread would wait there for good.
    params = {"seed": 104, "fault": "hang_cancellable", "at": 1}
    stream = single.synthesize("hi", EngineRequest(params=params))
    next(stream)
    assert stream_report(single, 104) == {"seed": 104, "chunks": 1, "ended": False}
    stream.close()
    assert wait_until(lambda: chunks_computed(single, 104), 10, "stream 104 ended") == 1


def test_close_fails_in_flight_cancels_queued_and_leaves_no_process(site):
    service = faulty_service({"engines.faulty.deployment": "local"})
    model = service.load("faulty").start()
    pids = worker_pids(model)
    stream = model.synthesize("hi", EngineRequest(params={"fault": "hang_cancellable", "at": 1}))
    next(stream)
    # The handle runs 4 submissions per replica at once: the fifth waits in its queue.
    hang = {"fault": "hang_cancellable"}
    futures = [
        model.submit("synthesize", "hi", request=EngineRequest(params=hang)) for _ in range(5)
    ]
    wait_until(lambda: model.replicas[0].in_flight == 5, 10, "5 in flight")
    assert not futures[4].running()

    service.close()
    with pytest.raises(EngineUnavailable):
        next(stream)
    for future in futures[:4]:
        with pytest.raises(EngineUnavailable):
            future.result(timeout=10)
    assert futures[4].cancelled()
    assert model.closed and [r.state for r in model.replicas] == ["stopped"]
    assert not any(running(pid) for pid in pids)
    service.close()
    model.close()  # both idempotent
    with pytest.raises(EngineUnavailable):
        model.call("pid")
    with pytest.raises(EngineUnavailable):
        model.submit("call", "pid")


def test_the_service_as_a_context_manager_stops_its_workers(site):
    with faulty_service({"engines.faulty.replicas": 2}) as service:
        model = service.load("faulty").start()
        pids = worker_pids(model)
        assert service.served() == [model]
    assert model.closed and service.served() == []
    assert len(pids) == 2 and not any(running(pid) for pid in pids)


def test_changing_an_engine_setting_closes_its_served_model(site):
    with faulty_service({"engines.faulty.deployment": "local"}) as service:
        model = service.load("faulty").start()
        pids = worker_pids(model)
        service.settings.set("engines.sine.replicas", 2)  # another engine's: no effect
        assert not model.closed and model.call("pid") == {"pid": pids[0]}
        service.settings.set("engines.faulty.execution_timeout", 30.0)
        assert model.closed and not running(pids[0])
        again = service.load("faulty")
        assert again is not model and [r.state for r in again.replicas] == ["stopped"]


def test_a_settings_change_lets_a_running_stream_finish_on_the_old_workers(site):
    with faulty_service({"engines.faulty.replicas": 2}) as service:
        model = service.load("faulty").start()
        pids = worker_pids(model)
        request = EngineRequest(params={"seed": 9, "chunks": 20, "chunk_samples": 100})
        stream = model.synthesize("hi", request)
        first = [next(stream) for _ in range(3)]
        service.settings.set("engines.faulty.execution_timeout", 30.0)
        with pytest.raises(EngineUnavailable, match="settings changed"):
            model.call("pid")  # a new request on the old model: load again
        again = service.load("faulty")
        assert again is not model and again.call("pid")["pid"] not in pids
        rest = list(stream)
        assert len(first + rest) == 20 and {c.metadata["pid"] for c in rest} <= set(pids)
        assert [c.metadata["index"] for c in first + rest] == list(range(20))
        wait_until(lambda: model.closed, 10, "the old model closed once its stream ended")
        wait_until(lambda: not any(running(pid) for pid in pids), 10, "its workers gone")
        assert service.served() == [again]


def test_an_in_process_plugin_cannot_be_served_by_workers(site):
    from mizuoto_fixture_serving import plugin

    discovery = Discovery(plugins={"in-process": plugin}, entry_points=False, selection=None)
    service = RuntimeService({"engines.faulty.deployment": "local"}, discovery)
    with pytest.raises(InvalidRequest, match="deployment = inline") as caught:
        service.load("faulty")
    assert caught.value.detail["field"] == "engines.faulty.deployment"
    service.settings.set("engines.faulty.deployment", "inline")
    assert service.load("faulty").mode == "inline"
    service.close()


def test_a_killed_host_leaves_no_worker_behind(site):
    host = subprocess.Popen(
        [sys.executable, "-c", HOST_SCRIPT, "", str(HERE), str(SITE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pids = [int(pid) for pid in host.stdout.readline().split()]
        assert len(pids) == 2 and all(running(pid) for pid in pids)
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait(timeout=30)
        host.stdin.close()
        host.stdout.close()
    killed = time.monotonic()
    wait_until(lambda: not any(running(pid) for pid in pids), ORPHAN_BOUND, "workers gone")
    assert time.monotonic() - killed < ORPHAN_BOUND


def test_a_killed_host_s_workers_end_their_calls_and_the_engines_children(site, tmp_path):
    host = subprocess.Popen(
        [sys.executable, "-c", HOST_SCRIPT, str(tmp_path), str(HERE), str(SITE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pids = [int(pid) for pid in host.stdout.readline().split()]
        child = int(wait_until(lambda: read_marker(tmp_path, "child"), 30, "the engine's child"))
        assert running(child) and not (tmp_path / "finally.pid").exists()
        # the workers (and so the engine's child) write their output to stderr, not the host's
        outputs = {os.readlink(f"/proc/{pid}/fd/1") for pid in [*pids, child]}
        assert outputs == {os.readlink(f"/proc/{host.pid}/fd/2")}
        assert os.readlink(f"/proc/{host.pid}/fd/1") not in outputs
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait(timeout=30)
        host.stdin.close()
    killed = time.monotonic()
    # a reader of the host's output sees its end: no worker or engine child keeps it open
    assert select.select([host.stdout], [], [], ORPHAN_BOUND)[0] and host.stdout.read() == ""
    host.stdout.close()
    # the worker that ran the stream cancelled it: the engine's finally ran, its child died
    finally_pid = wait_until(lambda: read_marker(tmp_path, "finally"), ORPHAN_BOUND, "finally")
    assert int(finally_pid) in pids
    wait_until(lambda: not running(child), ORPHAN_BOUND, "the engine's child gone")
    wait_until(lambda: not any(running(pid) for pid in pids), ORPHAN_BOUND, "workers gone")
    assert time.monotonic() - killed < ORPHAN_BOUND


def read_marker(folder, name):
    path = folder / f"{name}.pid"
    return path.read_text() if path.exists() else None


def test_bundled_engines_served_by_workers_equal_inline_bitwise():
    """sine and codeclm (torch in the workers): the same seed gives the same bytes."""
    inline = RuntimeService()
    settings = {"engines.codeclm.replicas": 2, "engines.sine.deployment": "local"}
    try:
        with RuntimeService(settings) as service:
            sine = service.load("sine")
            assert sine.mode == "local"
            expected = inline.load("sine").synthesize("a tune", EngineRequest(params={"seed": 5}))
            assert samples(sine.synthesize("a tune", EngineRequest(params={"seed": 5}))) == (
                samples(expected)
            )

            def request():
                return EngineRequest(params={"seed": 11, "max_frames": 32, "chunk_frames": 8})

            expected = samples(inline.load("codeclm").synthesize("Hello", request()))
            codeclm = service.load("codeclm").start()
            # two streams in flight at once: one on each replica
            streams = [codeclm.synthesize("Hello", request()) for _ in range(2)]
            firsts = [next(stream) for stream in streams]
            assert [r.in_flight for r in codeclm.replicas] == [1, 1]
            for first, stream in zip(firsts, streams, strict=True):
                assert samples([first, *stream]) == expected
    finally:
        inline.close()
