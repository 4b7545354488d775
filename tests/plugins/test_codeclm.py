"""The codec-LM engine: its weights, its codec's streaming, and its behaviour through the host."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
import time
import wave

import numpy as np
import pytest

from mizuoto_sdk import AudioChunk, CancelledError, EngineError
from mizuoto_sdk.host import EngineRequest, RuntimeService

TEXT = "Hello from Mizuoto"
RATE = 24_000
FRAMES = 32  # most tests bound the length: the decoder is untrained and rarely ends early


@pytest.fixture(scope="module")
def service() -> RuntimeService:
    return RuntimeService()


@pytest.fixture(scope="module")
def codeclm(service):
    return service.load("codeclm")


@pytest.fixture(scope="module")
def networks():
    import torch

    from mizuoto_engine_codeclm.make_weights import WEIGHTS_DIR
    from mizuoto_engine_codeclm.model import load_model

    return load_model(WEIGHTS_DIR, dtype=torch.float32, device="cpu")


@pytest.fixture
def voices(service, tmp_path):
    """tmp_path as the allowed voice folder, for one test."""
    service.settings.set("voices.roots", [tmp_path])
    yield tmp_path
    service.settings.set("voices.roots", [])


def audio(handle, text=TEXT, request=None, **params):
    request = request or EngineRequest(params={"max_frames": FRAMES, **params})
    chunks = list(handle.synthesize(text, request))
    return np.concatenate([c.samples for c in chunks]), chunks, request


def voice_like(rate: int, f0: float = 140.0, seconds: float = 1.5) -> np.ndarray:
    """Harmonics of ``f0`` below 7 kHz with a falling spectrum and a 4 Hz swell: the same
    continuous signal at any rate of 16 kHz or more."""
    t = np.arange(round(seconds * rate)) / rate
    harmonics = np.arange(1, int(7000 // f0) + 1)
    tone = (np.sin(2 * np.pi * f0 * harmonics[:, None] * t) / harmonics[:, None] ** 1.5).sum(0)
    return (0.3 * tone * (1 + 0.5 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


def write_wav(path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(samples, -1, 1) * 32767).round().astype("<i2").tobytes())


def test_the_weights_script_reproduces_the_shipped_file(tmp_path):
    from mizuoto_engine_codeclm.make_weights import WEIGHTS_DIR, write

    made = write(tmp_path)
    shipped = WEIGHTS_DIR / "model.safetensors"
    assert made.read_bytes() == shipped.read_bytes()
    assert shipped.stat().st_size < 10_000_000


@pytest.mark.parametrize("change", ["missing", "unexpected"])
def test_loading_is_strict_and_names_the_key(tmp_path, change):
    import torch
    from safetensors.torch import load_file, save_file

    from mizuoto_engine_codeclm.make_weights import WEIGHTS_DIR
    from mizuoto_engine_codeclm.model import load_model
    from mizuoto_runtime.weights.loading import LoadError

    state = load_file(WEIGHTS_DIR / "model.safetensors")
    key = "codec.post.bias" if change == "missing" else "codec.extra.weight"
    if change == "missing":
        del state[key]
    else:
        state[key] = torch.zeros(3)
    save_file(state, str(tmp_path / "model.safetensors"))
    shutil.copy(WEIGHTS_DIR / "config.json", tmp_path / "config.json")
    with pytest.raises(LoadError, match=key.replace(".", r"\.")) as caught:
        load_model(tmp_path, dtype=torch.float32, device="cpu")
    assert key in (caught.value.missing if change == "missing" else caught.value.unexpected)


def test_codec_streams_bitwise_equal_to_one_shot_however_cut(networks):
    import torch

    from mizuoto_engine_codeclm.model import CodecStream

    _, _, codec = networks
    generator = torch.Generator().manual_seed(7)
    codes = torch.randint(0, codec.config.codebook, (70,), generator=generator)
    with torch.inference_mode():
        whole = codec.decode(codes).numpy()
        for cuts in ([0, 1, 70], [0, 16, 32, 70], [0, 5, 23, 24, 61, 70], list(range(71))):
            stream = CodecStream.of(codec)
            parts = [stream.push(codes[a:b]).numpy() for a, b in itertools.pairwise(cuts)]
            assert np.array_equal(np.concatenate(parts), whole), cuts
    assert whole.shape == (70 * codec.config.hop,)
    assert np.isfinite(whole).all() and np.abs(whole).max() <= 1


def test_codec_is_causal_and_its_windows_cover_its_context(networks):
    import torch

    _, _, codec = networks
    generator = torch.Generator().manual_seed(8)
    codes = torch.randint(0, codec.config.codebook, (50,), generator=generator)
    hop = codec.config.hop
    with torch.inference_mode():
        blocked = codec.decode(codes)
        # one plain pass over everything, silence before the start, agrees to rounding
        silence = torch.full((codec.context,), -1, dtype=torch.long)
        plain = codec(torch.cat([silence, codes])[None])[0, codec.context * hop :]
        changed = codes.clone()
        changed[30:] = (changed[30:] + 1) % codec.config.codebook
        later = codec.decode(changed)
    torch.testing.assert_close(blocked, plain, rtol=0, atol=1e-5)
    assert torch.equal(later[: 30 * hop], blocked[: 30 * hop])
    assert not torch.equal(later[30 * hop :], blocked[30 * hop :])


def test_chunks_follow_chunk_frames_and_concatenate_to_the_one_shot_audio(codeclm):
    streamed, chunks, request = audio(codeclm, seed=5, chunk_frames=5)
    whole, single, _ = audio(codeclm, seed=5, chunk_frames=4096)
    assert len(single) == 1 and len(chunks) == FRAMES // 5 + 1
    assert {c.sample_rate for c in chunks} == {RATE}
    assert all(len(c.samples) == 5 * 320 for c in chunks[:-1])
    assert np.array_equal(streamed, whole)
    assert np.isfinite(streamed).all() and np.abs(streamed).max() <= 1
    assert request.applied["codeclm"]["frames"] * 320 == len(streamed)


def test_the_seed_decides_the_audio(codeclm):
    first, _, _ = audio(codeclm, seed=3)
    again, _, _ = audio(RuntimeService().load("codeclm"), seed=3)
    other, _, _ = audio(codeclm, seed=4)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)


def test_the_text_bounds_the_length(codeclm):
    short, _, request = audio(codeclm, "Hi", seed=0, max_frames=None)
    bound = request.applied["codeclm"]["max_frames"]
    assert bound == 4 * 2 + 16 and 8 * 320 <= len(short) <= bound * 320
    capped, _, _ = audio(codeclm, seed=0, max_frames=10)
    assert len(capped) == 10 * 320


def test_static_cache_gives_the_dynamic_cache_audio(service, codeclm):
    dynamic, _, first = audio(codeclm, seed=11)
    service.settings.set("compute.kv_cache", "static")
    try:
        static, _, second = audio(codeclm, seed=11)
    finally:
        service.settings.set("compute.kv_cache", "dynamic")
    assert (first.applied["kv_cache"], second.applied["kv_cache"]) == ("dynamic", "static")
    # the logits differ in the last bits (a masked full buffer); the sampled codes do not
    assert np.array_equal(dynamic, static)


def test_cuda_graphs_off_cuda_run_eagerly_and_say_so(service, codeclm):
    eager, _, _ = audio(codeclm, seed=2)
    service.settings.set("compute.cuda_graphs", True)
    try:
        graphed, _, request = audio(codeclm, seed=2)
    finally:
        service.settings.set("compute.cuda_graphs", False)
    assert request.applied["cuda_graphs"]["lm.decode"].startswith("eager: CUDA graphs need")
    assert any("compute.cuda_graphs" in w for w in request.warnings)
    assert np.array_equal(eager, graphed)


def test_progress_counts_frames_with_an_unknown_total_then_the_real_one(codeclm):
    seen = []
    request = EngineRequest(
        params={"seed": 1, "chunk_frames": 8}, progress=lambda *a: seen.append(a)
    )
    _, chunks, _ = audio(codeclm, "Hi", request=request)
    assert len(seen) == len(chunks) + 1
    assert [done for done, _, _ in seen[:-1]] == sorted({done for done, _, _ in seen[:-1]})
    # the bound is a maximum, never shown as the total; the last report has the real count
    bound = 4 * 2 + 16
    assert {(total, message) for _, total, message in seen[:-1]} == {
        (None, f"frames (at most {bound})")
    }
    frames = request.applied["codeclm"]["frames"]
    assert seen[-1] == (frames, frames, "frames") and seen[-2][0] == frames


def test_cancel_stops_midway(codeclm):
    request = EngineRequest(params={"seed": 0, "chunk_frames": 4})
    stream = codeclm.synthesize(TEXT, request)
    next(stream)
    request.cancel()
    time.sleep(0.06)  # the watcher forwards the cancel within 20 ms
    with pytest.raises(CancelledError):
        next(stream)
    again, _, _ = audio(codeclm, seed=0)
    assert len(again) == FRAMES * 320


def test_a_prepared_voice_conditions_synthesis(codeclm, voices):
    tmp_path = voices
    plain, _, _ = audio(codeclm, seed=6)
    result = codeclm.prepare_voice(AudioChunk(voice_like(16_000), 16_000), tmp_path / "low")
    assert result["files"] == ["voice.json"] and (tmp_path / "low" / "voice.json").is_file()
    voiced, _, request = audio(codeclm, seed=6, voice=str(tmp_path / "low"))
    again, _, _ = audio(codeclm, seed=6, voice=str(tmp_path / "low"))
    assert request.applied["codeclm"]["voice"] is True
    assert not np.array_equal(plain, voiced) and np.array_equal(voiced, again)
    higher = codeclm.prepare_voice(
        AudioChunk(voice_like(16_000, f0=260.0), 16_000), tmp_path / "high"
    )
    assert not np.allclose(result["embedding"], higher["embedding"], atol=0.1)


def test_voices_from_other_rates_and_wav_files(codeclm, voices):
    tmp_path = voices
    native = codeclm.prepare_voice(AudioChunk(voice_like(16_000), 16_000), tmp_path / "a")
    resampled = codeclm.prepare_voice(AudioChunk(voice_like(48_000), 48_000), tmp_path / "b")
    np.testing.assert_allclose(resampled["embedding"], native["embedding"], atol=0.02)
    wav = tmp_path / "reference.wav"
    write_wav(wav, voice_like(22_050), 22_050)
    from_wav, _, _ = audio(codeclm, seed=6, voice=str(wav))
    plain, _, _ = audio(codeclm, seed=6)
    assert not np.array_equal(from_wav, plain)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"temperature": 0}, "params.temperature"),
        ({"top_k": -1}, "params.top_k"),
        ({"top_p": 1.5}, "params.top_p"),
        ({"repetition_penalty": "high"}, "params.repetition_penalty"),
        ({"max_frames": 0}, "params.max_frames"),
        ({"max_frames": 10**6}, "params.max_frames"),
        ({"chunk_frames": True}, "params.chunk_frames"),
        ({"voice": 7}, "params.voice"),
        ({"voice": "/nonexistent/voice"}, "params.voice"),
    ],
)
def test_bad_params_name_the_field(codeclm, params, field):
    with pytest.raises(EngineError) as caught:
        audio(codeclm, seed=0, **params)
    assert caught.value.code == "invalid_request"
    assert caught.value.detail["field"] == field


def test_bad_text_and_voices_name_the_field(codeclm, voices):
    tmp_path = voices
    with pytest.raises(EngineError) as caught:
        audio(codeclm, "x" * 601, seed=0)
    assert (caught.value.code, caught.value.detail["field"]) == ("invalid_request", "text")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EngineError) as caught:
        audio(codeclm, seed=0, voice=str(tmp_path / "empty"))
    assert caught.value.detail["field"] == "params.voice"
    for samples in (np.zeros(16_000, np.float32), voice_like(16_000, seconds=0.2)):
        with pytest.raises(EngineError) as caught:
            codeclm.prepare_voice(AudioChunk(samples, 16_000), tmp_path / "voice")
        assert (caught.value.code, caught.value.detail["field"]) == ("invalid_request", "audio")
        assert not (tmp_path / "voice").exists()


def test_importing_the_plugin_and_engine_leaves_torch_unimported():
    script = (
        "import sys, mizuoto_engine_codeclm.plugin, mizuoto_engine_codeclm.engine; "
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

    results = run_contract("codeclm")
    # only the checks of a capability it does not declare (streamed text input) may skip
    failed = [f"{r.id}: {r.status}\n{r.message}" for r in results if r.bad or r.status == "xfail"]
    assert not failed, "\n".join(failed)
    assert [r.id for r in results if r.status == "skipped"] == [
        check.id for check in ALL if "text_input" in check.needs
    ]
    assert [r.id for r in results] == [check.id for check in ALL]


@pytest.mark.cuda
def test_cuda_graphs_replay_the_static_cache_decode():
    service = RuntimeService({"compute.kv_cache": "static"})
    handle = service.load("codeclm", device="cuda", dtype="float32")
    eager, _, _ = audio(handle, seed=9)
    service.settings.set("compute.cuda_graphs", True)
    graphed, _, request = audio(handle, seed=9)
    assert request.applied["cuda_graphs"]["lm.decode"].startswith("replayed")
    assert np.array_equal(eager, graphed)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_on_cuda_gives_finite_streamed_audio(dtype):
    handle = RuntimeService().load("codeclm", device="cuda", dtype=dtype)
    streamed, chunks, _ = audio(handle, seed=1, chunk_frames=7)
    whole, _, _ = audio(handle, seed=1, chunk_frames=4096)
    assert handle.description["dtype"] == dtype and len(chunks) > 1
    assert np.isfinite(streamed).all() and np.abs(streamed).max() <= 1
    assert np.array_equal(streamed, whole)


@pytest.mark.cuda
def test_compile_on_cuda_runs_the_decoder_and_codec_compiled():
    service = RuntimeService({"compute.compile": True})
    handle = service.load("codeclm", device="cuda", dtype="bfloat16")
    samples, _, request = audio(handle, seed=4)
    assert set(request.applied["compile"]) == {"codeclm.decoder", "codeclm.codec"}
    assert np.isfinite(samples).all() and len(samples) == FRAMES * 320
