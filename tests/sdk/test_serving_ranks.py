"""Replicas of several ranks, and ranks started by an external launcher (torchrun), on CPU/gloo.

The ``ranked`` fixture engine all-reduces (rank + 1) / 10 over ``dense_tp`` for every chunk, so
a chunk's value says how many ranks computed it: 0.1 alone, 0.1 + 0.2 with two.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from serving_support import SITE, faulty_service, running, wait_until

from mizuoto_sdk import CancelledError, InvalidRequest, WorkerFailed
from mizuoto_sdk.audio import read_wav
from mizuoto_sdk.host import EngineRequest

TWO_RANKS = {"engines.ranked.parallel.dense.tp_size": 2}
TWO = np.float32(0.1) + np.float32(0.2)


@pytest.fixture(scope="module")
def site():
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(SITE))
        yield


@pytest.fixture(scope="module")
def ranked(site):
    """One replica of two ranks, started once for the tests that leave it healthy."""
    with faulty_service(TWO_RANKS) as service:
        yield service.load("ranked").start()


def test_a_replica_of_two_ranks_runs_one_model_over_both(ranked):
    (replica,) = ranked.replicas
    assert ranked.mode == "local"
    assert replica.devices == ("cpu", "cpu") and len(set(replica.pids)) == 2
    seen = ranked.call("ranks")
    assert seen["world"] == [0, 2] and seen["dense_tp"] == [0, 2]
    assert seen["same_as_load"] is True  # the groups of the load are the groups of the calls
    assert seen["pid"] == replica.pids[0]  # rank 0 answers
    chunks = list(ranked.synthesize("hi", EngineRequest(params={"chunks": 3})))
    assert len(chunks) == 3
    for chunk in chunks:
        np.testing.assert_array_equal(chunk.samples, np.full(160, TWO, dtype=np.float32))


def test_ranks_stop_together_when_a_stream_is_closed_or_cancelled(ranked):
    slow = {"chunks": 200, "hold": 0.02}
    stream = ranked.synthesize("hi", EngineRequest(params=slow))
    next(stream)
    stream.close()  # every rank stops at the same chunk: the next request's collectives meet
    request = EngineRequest(params=slow)
    stream = ranked.synthesize("hi", request)
    next(stream)
    request.cancel()
    with pytest.raises(CancelledError):
        list(stream)
    again = list(ranked.synthesize("hi"))
    assert [float(c.samples[0]) for c in again] == [float(TWO)] * 3


def test_a_rank_that_dies_fails_its_replica(site):
    with faulty_service(TWO_RANKS) as service:
        model = service.load("ranked").start()
        (replica,) = model.replicas
        stream = model.synthesize("hi", EngineRequest(params={"chunks": 500, "hold": 0.02}))
        next(stream)
        os.kill(replica.pids[1], signal.SIGKILL)  # not the output rank
        with pytest.raises(WorkerFailed) as caught:
            list(stream)
        assert caught.value.detail["replica"] == 0
        assert caught.value.detail["during"] == "synthesize"
        assert model.replicas[0].state == "failed"
    assert wait_until(lambda: not any(running(pid) for pid in replica.pids), 5, "ranks gone")


def test_a_split_the_engine_did_not_declare_is_refused_before_any_worker_starts(site):
    # ranked declares dense only; attention split explicitly is not its to run
    settings = {**TWO_RANKS, "engines.ranked.parallel.attention.tp_size": 2}
    with faulty_service(settings) as service:
        with pytest.raises(InvalidRequest) as caught:
            service.load("ranked")
        assert "attention" in str(caught.value)
        assert caught.value.detail["field"] == "engines.ranked.parallel"
        assert service.served() == []
    undeclared = faulty_service({"engines.faulty.parallel.dense.tp_size": 2})
    with undeclared, pytest.raises(InvalidRequest, match="dense"):
        undeclared.load("faulty")


def test_torchrun_runs_one_rank_per_process_and_the_output_rank_writes(site, tmp_path):
    out = tmp_path / "ranked.wav"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "mizuoto_sdk.cli",
        "synth",
        "ranked",
        "hello",
        "-o",
        str(out),
        "--set",
        "engines.ranked.deployment=external",
        "--set",
        "engines.ranked.parallel.dense.tp_size=2",
    ]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SITE), *sys.path])}
    done = subprocess.run(
        command, env=environment, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("wrote") == 1  # one WAV, from the output rank
    assert "this rank computed its part" in done.stdout
    audio = read_wav(out)
    assert audio.samples.shape == (480,)
    np.testing.assert_allclose(audio.samples, float(TWO), atol=1 / 2**15)
