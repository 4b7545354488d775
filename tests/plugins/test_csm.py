"""The csm engine through the host: streaming, the end frame, its shipped files, refusals."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from mizuoto_sdk import AudioChunk, CancelledError, EngineError
from mizuoto_sdk.host import EngineRequest, RuntimeService

TEXT = "Hello from Mizuoto."
HOP = 1920  # Mimi: 24 kHz at 12.5 frames per second


@pytest.fixture(scope="module")
def service() -> RuntimeService:
    return RuntimeService()


@pytest.fixture(scope="module")
def csm(service):
    return service.load("csm")


@pytest.fixture
def voices(service, tmp_path):
    service.settings.set("voices.roots", [tmp_path])
    yield tmp_path
    service.settings.set("voices.roots", [])


def audio(handle, text=TEXT, **params):
    request = EngineRequest(params={"max_frames": 3, **params})
    chunks = list(handle.synthesize(text, request))
    return np.concatenate([c.samples for c in chunks]), chunks, request


def test_chunks_come_every_chunk_frames_and_join_to_the_whole_decode(csm):
    whole, (one,), _ = audio(csm, seed=4, max_frames=7, chunk_frames=0)
    streamed, chunks, request = audio(csm, seed=4, max_frames=7, chunk_frames=3)
    assert [c.metadata["frames"] for c in chunks] == [3, 6, 7]
    assert [len(c.samples) for c in chunks] == [3 * HOP, 3 * HOP, HOP]
    assert len(streamed) == len(whole) == 7 * HOP and one.metadata["frames"] == 7
    assert np.abs(streamed - whole).max() <= 1e-4
    assert request.applied["csm"]["frames"] == 7


def test_the_seed_decides_the_audio(csm):
    first, _, _ = audio(csm, seed=1)
    again, _, _ = audio(csm, seed=1)
    other, _, _ = audio(csm, seed=2)
    assert np.array_equal(first, again) and not np.array_equal(first, other)


def test_cancel_stops_midway(csm):
    request = EngineRequest(params={"seed": 0, "chunk_frames": 1, "max_frames": 20})
    stream = csm.synthesize(TEXT, request)
    next(stream)
    request.cancel()
    time.sleep(0.06)  # the watcher forwards the cancel within 20 ms
    with pytest.raises(CancelledError):
        list(stream)


def test_a_static_cache_and_cuda_graphs_off_cuda_speak_as_the_dynamic_cache(service, csm):
    dynamic, _, first = audio(csm, seed=11, max_frames=6)
    service.settings.set("compute.kv_cache", "static")
    try:
        static, _, second = audio(csm, seed=11, max_frames=6)
        service.settings.set("compute.cuda_graphs", True)
        graphed, _, third = audio(csm, seed=11, max_frames=6)
    finally:
        service.settings.set("compute.kv_cache", "dynamic")
        service.settings.set("compute.cuda_graphs", False)
    assert (first.applied["kv_cache"], second.applied["kv_cache"]) == ("dynamic", "static")
    assert third.applied["cuda_graphs"]["csm.backbone"].startswith("eager: CUDA graphs need a")
    # the logits differ in the last bits (a masked full buffer); the sampled codes do not
    assert np.array_equal(dynamic, static) and np.array_equal(static, graphed)


def test_cuda_graphs_over_a_dynamic_cache_run_eagerly_and_warn(service, csm):
    service.settings.set("compute.cuda_graphs", True)
    try:
        _, _, request = audio(csm, seed=1)
    finally:
        service.settings.set("compute.cuda_graphs", False)
    assert "kv_cache=static" in request.applied["cuda_graphs"]["csm.backbone"]
    assert any("compute.cuda_graphs" in warning for warning in request.warnings)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"temperature": 0}, "params.temperature"),
        ({"top_k": -1}, "params.top_k"),
        ({"max_frames": 0}, "params.max_frames"),
        ({"max_frames": 10**6}, "params.max_frames"),
        ({"chunk_frames": -1}, "params.chunk_frames"),
        ({"speaker": -1}, "params.speaker"),
        ({"speaker": "a"}, "params.speaker"),
        ({"voice": 7}, "params.voice"),
        ({"voice": "/nonexistent/voice"}, "params.voice"),
    ],
)
def test_bad_params_name_the_field(csm, params, field):
    with pytest.raises(EngineError) as caught:
        audio(csm, seed=0, **params)
    assert caught.value.code == "invalid_request"
    assert caught.value.detail["field"] == field


def test_bad_text_and_voices_name_the_field(csm, voices):
    with pytest.raises(EngineError) as caught:
        audio(csm, "say <|AUDIO|> here", seed=0)
    assert (caught.value.code, caught.value.detail["field"]) == ("invalid_request", "text")
    (voices / "broken").mkdir()
    (voices / "broken" / "voice.json").write_text(json.dumps({"format": "mizuoto-csm-voice"}))
    with pytest.raises(EngineError) as caught:
        audio(csm, seed=0, voice="broken")
    assert caught.value.detail["field"] == "params.voice"
    speech = (0.3 * np.sin(np.arange(24_000) / 9)).astype(np.float32)
    cases = [
        (speech, 24_000, {"transcript": "a <|audio_eos|> b"}, "params.transcript"),
        (speech[:2400], 24_000, {"transcript": "hi"}, "audio"),
        (speech, 4_000, {"transcript": "hi"}, "audio"),
    ]
    for samples, rate, params, field in cases:
        with pytest.raises(EngineError) as caught:
            csm.prepare_voice(AudioChunk(samples, rate), voices / "v", EngineRequest(params=params))
        assert (caught.value.code, caught.value.detail["field"]) == ("invalid_request", field)
        assert not (voices / "v").exists()
    request = EngineRequest(params={})  # no transcript: a context turn without words, said so
    result = csm.prepare_voice(AudioChunk(speech, 24_000), voices / "wordless", request)
    assert result["frames"] == 13 and any("params.transcript" in w for w in request.warnings)
    audio(csm, seed=0, voice="wordless")


def test_a_voice_at_another_rate_is_resampled_to_the_codecs(csm, voices):
    t = np.arange(48_000) / 48_000
    speech = (0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32)
    result = csm.prepare_voice(
        AudioChunk(speech, 48_000), voices / "v48", EngineRequest(params={"transcript": "hi"})
    )
    assert result["frames"] == 13 and result["speaker"] == 0  # 1 s: ceil(24000 / 1920) frames
    _, _, request = audio(csm, seed=1, voice="v48")
    assert request.applied["csm"]["prompt_tokens"] > 13


def test_broken_checkpoints_name_the_key(tmp_path):
    import torch

    from mizuoto_engine_csm.config import CsmConfig
    from mizuoto_engine_csm.make_weights import WEIGHTS_DIR
    from mizuoto_engine_csm.model import load_networks
    from mizuoto_sdk.errors import EngineUnavailable

    folder = tmp_path / "broken"
    shutil.copytree(WEIGHTS_DIR, folder)
    config = json.loads((folder / "config.json").read_text())
    for change, key in (
        ({"model_type": "llama"}, "model_type"),
        ({"num_codebooks": 6}, "num_codebooks"),
        ({"rope_parameters": {"rope_type": "longrope"}}, "rope_type"),
    ):
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(EngineUnavailable, match=key):
            CsmConfig.from_folder(folder)
    (folder / "config.json").write_text(json.dumps(config))
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(
        json.dumps({**generation, "repetition_penalty": 1.2})
    )
    with pytest.raises(EngineUnavailable, match="repetition_penalty"):
        CsmConfig.from_folder(folder)
    (folder / "generation_config.json").write_text(json.dumps(generation))
    from safetensors.torch import load_file, save_file

    state = load_file(folder / "model.safetensors")
    del state["depth_decoder.codebooks_head.weight"]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(EngineUnavailable, match="codebooks_head"):
        load_networks(
            folder, CsmConfig.from_folder(folder), dtype=torch.float32, device="cpu", name="x"
        )


def test_importing_the_plugin_and_engine_leaves_torch_unimported():
    script = (
        "import sys, mizuoto_engine_csm.plugin, mizuoto_engine_csm.engine; "
        "print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False", done.stderr


@pytest.mark.slow
def test_the_contract_passes_every_check():
    from mizuoto_contract import run_contract
    from mizuoto_contract.checks import ALL

    results = run_contract("csm")
    # only the checks of a capability it does not declare (streamed text input) may skip
    failed = [f"{r.id}: {r.status}\n{r.message}" for r in results if r.bad or r.status == "xfail"]
    assert not failed, "\n".join(failed)
    assert [r.id for r in results if r.status == "skipped"] == [
        check.id for check in ALL if "text_input" in check.needs
    ]
    assert [r.id for r in results] == [check.id for check in ALL]


@pytest.mark.cuda
def test_cuda_float32_speaks_as_the_cpu_does():
    """The backbone and depth decoder on CUDA: the same frames as on the CPU (the sampled codes
    are robust to the last bits), finite audio of the same length."""
    cpu, _, cpu_request = audio(RuntimeService().load("csm"), seed=3, max_frames=8)
    handle = RuntimeService().load("csm", device="cuda", dtype="float32")
    gpu, _, request = audio(handle, seed=3, max_frames=8)
    assert request.applied["csm"]["frames"] == cpu_request.applied["csm"]["frames"]
    assert len(gpu) == len(cpu) and np.isfinite(gpu).all()


@pytest.mark.cuda
def test_cuda_graphs_replay_the_backbone_step_as_eager_runs_it():
    service = RuntimeService({"compute.kv_cache": "static"})
    handle = service.load("csm", device="cuda", dtype="float32")
    eager, _, _ = audio(handle, seed=9, max_frames=8)
    service.settings.set("compute.cuda_graphs", True)
    graphed, _, request = audio(handle, seed=9, max_frames=8)
    again, _, _ = audio(handle, seed=9, max_frames=8)
    assert request.applied["cuda_graphs"]["csm.backbone"].startswith("replayed")
    assert np.array_equal(eager, graphed) and np.array_equal(graphed, again)


@pytest.mark.cuda
def test_bfloat16_on_cuda_streams_finite_audio():
    handle = RuntimeService().load("csm", device="cuda", dtype="bfloat16")
    streamed, chunks, _ = audio(handle, seed=1, max_frames=8, chunk_frames=3)
    assert len(chunks) == 3 and len(streamed) == 8 * HOP and np.isfinite(streamed).all()
