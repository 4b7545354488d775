"""The ``faulty`` fixture engine (tests/sdk/serving_site) behaves as the serving tests expect.

The serving tests run it in worker processes; here it runs in this one, through the host, so a
fault seen there is the fault asked for. Faults that end or freeze a process (exit, hang) are
only run in a child process.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mizuoto_sdk import (
    AudioChunk,
    CancelledError,
    EngineError,
    InvalidRequest,
    OperationTimeoutError,
)
from mizuoto_sdk.discovery import Discovery
from mizuoto_sdk.host import EngineRequest, RuntimeService

SITE = Path(__file__).parent / "serving_site"
BOUND = 1.0  # seconds: a 20 ms watcher and 50 ms waits stop far sooner


@pytest.fixture
def service(monkeypatch):
    monkeypatch.syspath_prepend(str(SITE))
    return RuntimeService(discovery=Discovery(path=[str(SITE)], selection=None))


@pytest.fixture
def model(service):
    return service.engine("faulty").load()


def synthesize(model, **params):
    return list(model.synthesize("hello", EngineRequest(params=params)))


def test_a_seed_decides_the_audio_and_chunks_carry_pid_and_index(model):
    chunks = synthesize(model, seed=7, chunks=3, chunk_samples=800)
    assert [c.metadata for c in chunks] == [{"pid": os.getpid(), "index": i} for i in range(3)]
    assert {(c.sample_rate, c.samples.dtype, c.samples.shape) for c in chunks} == {
        (16_000, np.dtype("float32"), (800,))
    }
    again = synthesize(model, seed=7, chunks=3, chunk_samples=800)
    other = synthesize(model, seed=8, chunks=3, chunk_samples=800)
    assert [c.samples.tobytes() for c in chunks] == [c.samples.tobytes() for c in again]
    assert chunks[0].samples.tobytes() != other[0].samples.tobytes()


def test_convert_hands_the_input_back_in_pieces(model):
    audio = AudioChunk(np.arange(10, dtype=np.float32), 8_000)
    chunks = list(model.convert(audio, EngineRequest(params={"chunks": 3})))
    assert [len(c.samples) for c in chunks] == [4, 3, 3]
    assert np.concatenate([c.samples for c in chunks]).tolist() == list(range(10))
    assert {c.sample_rate for c in chunks} == {8_000}


def test_prepare_voice_writes_the_sample_count(model, tmp_path):
    audio = AudioChunk(np.zeros(123, dtype=np.float32), 16_000)
    assert model.prepare_voice(audio, tmp_path / "voice") == {"samples": 123}
    assert json.loads((tmp_path / "voice" / "voice.json").read_text()) == {"samples": 123}


def test_call_operations(model):
    assert model.call("pid") == {"pid": os.getpid()}
    assert model.call("echo", {"a": [1, 2]}) == {"a": [1, 2]}
    assert model.call("sleep", {"seconds": 0}) == {"slept": 0}
    with pytest.raises(OperationTimeoutError):
        model.call("sleep", {"seconds": 30}, EngineRequest(timeout=0.1))
    with pytest.raises(InvalidRequest) as caught:
        model.call("dance")
    assert caught.value.detail["field"] == "op"


def test_invalid_and_crash_come_before_chunk_at(model):
    stream = model.synthesize("hello", EngineRequest(params={"fault": "invalid", "at": 2}))
    assert len([next(stream), next(stream)]) == 2
    with pytest.raises(InvalidRequest) as caught:
        next(stream)
    assert caught.value.detail["field"] == "text"
    with pytest.raises(EngineError) as crashed:
        synthesize(model, fault="crash")
    assert crashed.value.code == "engine_error"
    assert "on purpose" in crashed.value.message


@pytest.mark.parametrize(
    ("params", "request_options", "error"),
    [
        ({"fault": "hang_cancellable"}, {"timeout": 0.1}, OperationTimeoutError),
        ({"fault": "slow", "delay": 30}, {"timeout": 0.1}, OperationTimeoutError),
        ({"fault": "hang_cancellable", "at": 1}, {}, CancelledError),
    ],
)
def test_cancellable_waits_stop_at_timeout_and_cancel(model, params, request_options, error):
    request = EngineRequest(params=params, **request_options)
    if error is CancelledError:
        request.cancel()
    started = time.perf_counter()
    with pytest.raises(error):
        list(model.synthesize("hello", request))
    assert time.perf_counter() - started < BOUND


def test_slow_delays_each_chunk(model):
    started = time.perf_counter()
    assert len(synthesize(model, fault="slow", delay=0.05, chunks=2)) == 2
    assert time.perf_counter() - started >= 0.1


def test_load_options_and_description(service):
    model = service.engine("faulty").load(options={"load_delay": 0})
    assert model.description["pid"] == os.getpid()
    with pytest.raises(EngineError, match="load failed on purpose") as caught:
        service.engine("faulty").load(options={"fault_on_load": "raise"})
    assert caught.value.code == "engine_error"


def test_loads_on_cuda_without_touching_a_gpu(service):
    model = service.engine("faulty", "cuda").load()
    assert model.description["device"] == "cuda"
    assert len(synthesize(model, chunks=1)) == 1


# A child process that finds the engine only through its folder: prints the seeded audio's hash,
# then asks for an exit before chunk 1 and prints each chunk it gets.
CHILD = """
import hashlib, sys
from mizuoto_sdk.discovery import Discovery
from mizuoto_sdk.host import EngineRequest, RuntimeService
service = RuntimeService(discovery=Discovery(path=[sys.argv[1]], selection=None))
model = service.engine("faulty").load()
chunks = model.synthesize("hi", EngineRequest(params={"seed": 7}))
print(hashlib.sha256(b"".join(c.samples.tobytes() for c in chunks)).hexdigest(), flush=True)
for chunk in model.synthesize("hi", EngineRequest(params={"fault": "exit", "at": 1})):
    print("chunk", chunk.metadata["index"], flush=True)
print("not reached", flush=True)
"""


def test_exit_ends_the_process_with_code_3_and_audio_matches_across_processes(model):
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(SITE)],
        env={**os.environ, "PYTHONPATH": str(SITE)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    digest, *rest = done.stdout.splitlines()
    assert rest == ["chunk 0"]
    here = b"".join(c.samples.tobytes() for c in synthesize(model, seed=7))
    assert digest == hashlib.sha256(here).hexdigest()
