"""LocalEngine streams: lazy, checked, converted, closed with the caller."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from mizuoto_sdk import AudioChunk, EngineError
from mizuoto_sdk.host import EngineRequest, RuntimeService


@pytest.fixture
def handle(host_engine):
    service = RuntimeService(discovery=host_engine.discovery)
    return service.load(host_engine.engine_id, "a")


def labels(events):
    return [event[0] for event in events]


def test_load_runs_outside_inference_mode_with_the_context_bound(host_engine, handle):
    (load,) = [e for e in host_engine.events if e[0] == "load"]
    assert load[1] is False  # not in inference mode
    assert load[2] is True  # context bound


def test_no_engine_code_runs_before_the_first_next(host_engine, handle):
    host_engine.events.clear()
    stream = handle.synthesize("hello world")
    assert host_engine.events == []
    assert handle.engine.state == "ready"
    first = next(stream)
    assert labels(host_engine.events) == ["start"]  # paused at its first yield
    assert handle.engine.state == "busy"
    assert first.sample_rate == 16000
    stream.close()


def test_each_step_runs_on_the_callers_thread_in_inference_mode(host_engine, handle):
    host_engine.events.clear()
    outside = []
    for _ in handle.synthesize("hello"):
        outside.append(torch.is_inference_mode_enabled())
    steps = [e for e in host_engine.events if e[0].startswith(("start", "chunk"))]
    assert all(inference and bound for _, inference, bound, _ in steps)
    assert {thread for *_, thread in steps} == {threading.get_ident()}
    assert outside == [False, False, False]  # the caller's own code runs in neither


def test_chunks_become_float32_mono_numpy_and_keep_metadata(handle):
    chunks = list(handle.synthesize("hello"))
    for index, chunk in enumerate(chunks):
        assert isinstance(chunk, AudioChunk)
        assert isinstance(chunk.samples, np.ndarray) and chunk.samples.dtype == np.float32
        assert chunk.samples.shape == (4,)
        # The engine yields two channels holding index and index + 1: mono is their mean.
        np.testing.assert_array_equal(chunk.samples, np.full(4, index + 0.5, np.float32))
        assert chunk.metadata["index"] == index


def test_torch_bfloat16_chunks_are_converted(handle):
    (chunk, *_) = handle.synthesize("hello", EngineRequest(params={"mode": "torch"}))
    assert chunk.samples.dtype == np.float32 and chunk.samples.shape == (8,)
    np.testing.assert_array_equal(chunk.samples, np.full(8, 0.5, np.float32))


def test_a_chunk_that_is_not_an_audio_chunk_fails_naming_its_type(host_engine, handle):
    with pytest.raises(EngineError) as caught:
        list(handle.synthesize("hello", EngineRequest(params={"mode": "bad_chunk"})))
    assert caught.value.code == "engine_error"
    assert "builtins.list" in str(caught.value) and "AudioChunk" in str(caught.value)
    assert ("finally", "bad_chunk") in host_engine.events  # the engine's generator was closed


def test_a_sample_rate_change_mid_stream_is_an_error(handle):
    stream = handle.synthesize("hello", EngineRequest(params={"mode": "rate_change"}))
    next(stream)
    with pytest.raises(EngineError, match="sample_rate 16001, earlier chunks 16000"):
        next(stream)


def test_closing_the_stream_early_runs_the_engines_finally_and_frees_the_handle(
    host_engine, handle
):
    host_engine.events.clear()
    request = EngineRequest()
    stream = handle.synthesize("hello", request)
    next(stream)
    next(stream)
    stream.close()
    assert labels(host_engine.events) == ["start", "chunk0", "finally"]
    assert handle.engine.state == "ready"
    assert "total" in request.timings and "first_chunk" in request.timings


def test_timings_applied_and_progress_are_written_back(handle):
    progress = []
    request = EngineRequest(params={"seed": 11}, progress=lambda *a: progress.append(a))
    list(handle.synthesize("hello", request))
    assert 0 <= request.timings["first_chunk"] <= request.timings["total"]
    assert request.applied["seed"] == 11
    assert progress == [(1, 3, None), (2, 3, None), (3, 3, None)]


def test_an_unseeded_request_records_the_seed_it_used(handle):
    request = EngineRequest(params={"mode": "tones"})
    list(handle.synthesize("hello", request))
    assert isinstance(request.applied["seed"], int)


def test_inputs_are_validated_before_the_engine_runs(host_engine, handle):
    host_engine.events.clear()
    for text in ("", "   "):
        with pytest.raises(EngineError) as caught:
            handle.synthesize(text)
        assert caught.value.code == "invalid_request" and caught.value.detail["field"] == "text"
    with pytest.raises(EngineError) as caught:
        handle.synthesize("hi", EngineRequest(params={"seed": -1}))
    assert caught.value.detail["field"] == "params.seed"
    assert host_engine.events == []


def test_an_undeclared_capability_is_unsupported(handle):
    with pytest.raises(EngineError) as caught:
        handle.convert(AudioChunk(np.zeros(4, np.float32), 16000))
    assert caught.value.code == "capability_not_supported"
    assert caught.value.detail["engine"] == "hosted"


def test_call_runs_the_operation_and_an_unknown_op_is_unsupported(handle):
    assert handle.call("echo", {"x": 1}, EngineRequest(params={"seed": 5})) == {"x": 1, "seed": 5}
    with pytest.raises(EngineError) as caught:
        handle.call("nope")
    assert caught.value.code == "capability_not_supported"


def test_prepare_voice_writes_the_folder_only_when_it_succeeds(handle, tmp_path):
    audio = AudioChunk(np.zeros(16, np.float32), 16000)
    failed = tmp_path / "voices" / "broken"
    with pytest.raises(EngineError):
        handle.prepare_voice(audio, failed, EngineRequest(params={"mode": "raise"}))
    assert not failed.exists()
    assert [p.name for p in failed.parent.iterdir()] == []  # no staging folder left either
    voice = tmp_path / "voices" / "alice"
    assert handle.prepare_voice(audio, voice) == {"files": ["embedding.npy"]}
    assert (voice / "embedding.npy").read_bytes() == b"half"
    with pytest.raises(EngineError) as caught:
        handle.prepare_voice(audio, voice)
    assert caught.value.detail["field"] == "voice_dir"
