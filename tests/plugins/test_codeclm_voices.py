"""codeclm's inputs at their limits: where voices may come from, what recordings it accepts."""

from __future__ import annotations

import os
import shutil
import struct
import time

import numpy as np
import pytest

from mizuoto_sdk import AudioChunk, EngineError
from mizuoto_sdk.host import EngineRequest, RuntimeService

FRAMES = 8


@pytest.fixture(scope="module")
def service() -> RuntimeService:
    return RuntimeService()


@pytest.fixture(scope="module")
def codeclm(service):
    return service.load("codeclm")


@pytest.fixture
def root(service, tmp_path):
    """``tmp_path/root`` as the one allowed voice folder, for one test."""
    (tmp_path / "root").mkdir()
    service.settings.set("voices.roots", [tmp_path / "root"])
    yield tmp_path / "root"
    service.settings.set("voices.roots", [])


def speech_like(rate: int, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    tone = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 20))
    return (0.2 * tone * (1 + 0.5 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


def wav_bytes(rate: int, width: int, channels: int, data: bytes, declared: int | None = None):
    """A PCM WAV file's bytes, written by hand so that any header value can be given."""
    fmt = struct.pack(
        "<HHIIHH", 1, channels, rate, rate * channels * width, channels * width, 8 * width
    )
    size = len(data) if declared is None else declared
    riff = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", size)
    return b"RIFF" + struct.pack("<I", len(riff) + len(data)) + riff + data


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).round().astype("<i2").tobytes()


def audio(handle, text="Hello", request=None, **params):
    request = request or EngineRequest(params={"max_frames": FRAMES, "seed": 1, **params})
    return np.concatenate([c.samples for c in handle.synthesize(text, request)])


def refusal(handle, **params) -> EngineError:
    with pytest.raises(EngineError) as caught:
        audio(handle, **params)
    assert caught.value.code == "invalid_request", caught.value
    assert caught.value.detail["field"] == "params.voice"
    return caught.value


def test_voices_outside_the_allowed_folders_get_one_answer(codeclm, root, tmp_path):
    outside = tmp_path / "outside.wav"
    outside.write_bytes(wav_bytes(16_000, 2, 1, pcm16(speech_like(16_000))))
    codeclm.prepare_voice(AudioChunk(speech_like(16_000), 16_000), tmp_path / "prepared")
    (root / "link.wav").symlink_to(outside)
    (root / "folder-link").symlink_to(tmp_path / "prepared", target_is_directory=True)
    names = [
        str(outside),  # exists, readable, a good voice: outside the roots all the same
        str(tmp_path / "prepared"),
        "../outside.wav",
        "link.wav",
        "folder-link",
        os.fspath(root / ".." / "outside.wav"),
        "/etc/passwd",
        "/nonexistent/voice.wav",
        "missing.wav",
        str(root / "missing"),
        "x" * 5000,
        "bad\0name",
        str(root),  # the root itself holds no voice.json: then the voice file's own error
    ]
    messages = {}
    for name in names[:-1]:
        messages[name] = str(refusal(codeclm, voice=name)).replace(repr(name), "VOICE")
    assert len(set(messages.values())) == 1, messages
    assert "outside" not in next(iter(messages.values()))
    assert "not a codeclm voice" in str(refusal(codeclm, voice=names[-1]))
    (root / "linked").mkdir()  # a voice folder whose voice.json links out of the roots
    (root / "linked" / "voice.json").symlink_to(tmp_path / "prepared" / "voice.json")
    assert "not a codeclm voice" in str(refusal(codeclm, voice="linked"))


def test_a_voice_is_found_by_name_or_path_inside_a_root(codeclm, root):
    codeclm.prepare_voice(AudioChunk(speech_like(16_000), 16_000), root / "anna")
    (root / "wavs").mkdir()
    (root / "wavs" / "bob.wav").write_bytes(wav_bytes(22_050, 2, 1, pcm16(speech_like(22_050))))
    plain = audio(codeclm)
    by_name, by_path = audio(codeclm, voice="anna"), audio(codeclm, voice=str(root / "anna"))
    assert np.array_equal(by_name, by_path) and not np.array_equal(by_name, plain)
    assert not np.array_equal(audio(codeclm, voice="wavs/bob.wav"), plain)


def test_the_models_own_voices_folder_is_allowed(tmp_path):
    import torch

    from mizuoto_engine_codeclm.engine import CodecLMEngine
    from mizuoto_engine_codeclm.make_weights import WEIGHTS_DIR
    from mizuoto_runtime.context import RequestContext
    from mizuoto_runtime.runtime import Runtime
    from mizuoto_sdk import LoadSpec

    model_dir = tmp_path / "model"
    shutil.copytree(WEIGHTS_DIR, model_dir)
    (model_dir / "voices").mkdir()
    (model_dir / "voices" / "own.wav").write_bytes(
        wav_bytes(16_000, 2, 1, pcm16(speech_like(16_000)))
    )
    spec = LoadSpec(model_id="tiny", device="cpu", dtype="float32", model_dir=model_dir)
    loaded = CodecLMEngine().load(spec, Runtime(), RequestContext(seed=0))
    params = {"voice": "own.wav", "max_frames": FRAMES}
    with torch.inference_mode():  # as the host runs every call
        chunks = list(loaded.synthesize("Hello", params, RequestContext(seed=1, params=params)))
    assert sum(len(c.samples) for c in chunks) == FRAMES * 320
    with pytest.raises(EngineError) as caught:
        list(
            loaded.synthesize(
                "Hello", {"voice": str(WEIGHTS_DIR / "config.json")}, RequestContext(seed=1)
            )
        )
    assert caught.value.code == "invalid_request"


@pytest.mark.parametrize(
    ("rate", "width", "channels", "seconds", "declared", "says"),
    [
        (16_000, 5, 1, 1.0, None, "40-bit"),  # was KeyError
        (0, 2, 1, 1.0, None, "sample rate 0 Hz"),  # was ZeroDivisionError
        (999_983, 2, 1, 1.0, None, "sample rate 999983 Hz"),  # took 14 s
        (7, 2, 1, 1.0, None, "sample rate 7 Hz"),
        (16_000, 2, 200, 0.01, None, "200 channels"),
        (16_000, 2, 1, 1.0, 2 * 16_000 * 700, "700 s"),  # a header that claims 700 s
        (16_000, 2, 1, 0.0, None, "0.00 s"),
    ],
)
def test_recordings_outside_the_bounds_are_invalid_requests(
    codeclm, root, rate, width, channels, seconds, declared, says
):
    data = b"\x01" * (round(16_000 * seconds) * width * channels)
    (root / "v.wav").write_bytes(wav_bytes(rate, width, channels, data, declared))
    start = time.process_time()  # CPU time: a busy machine cannot stretch it past the bound
    assert says in str(refusal(codeclm, voice="v.wav"))
    assert time.process_time() - start < 5


def test_a_truncated_wav_reads_its_whole_frames(codeclm, root):
    data = pcm16(speech_like(16_000))
    (root / "v.wav").write_bytes(wav_bytes(16_000, 2, 1, data[:-1], declared=len(data)))
    assert len(audio(codeclm, voice="v.wav")) == FRAMES * 320


def test_prepare_voice_bounds_the_rate_and_length(codeclm, tmp_path):
    for chunk, says in [
        (AudioChunk(speech_like(16_000), 999_983), "sample rate 999983 Hz"),
        (AudioChunk(np.zeros(8_000 * 601, np.float32), 8_000), "601 s"),
    ]:
        with pytest.raises(EngineError) as caught:
            codeclm.prepare_voice(chunk, tmp_path / "v")
        assert (caught.value.code, caught.value.detail["field"]) == ("invalid_request", "audio")
        assert says in str(caught.value)


def test_a_timeout_stops_a_long_resample(codeclm, tmp_path):
    recording = AudioChunk(np.tile(speech_like(191_999), 30), 191_999)  # 30 s at an odd rate
    request = EngineRequest(timeout=0.1)
    start = time.process_time()  # CPU time, as above: the timeout is 0.1 s of wall time
    with pytest.raises(EngineError) as caught:
        codeclm.prepare_voice(recording, tmp_path / "v", request)
    assert caught.value.code == "operation_timeout"
    assert time.process_time() - start < 1.5  # stops in about 0.3 s; the whole took 18 s before


def test_a_lone_surrogate_in_the_text_is_an_invalid_request(codeclm):
    for text in ("Hello \udc80", "\ud800", "a\udfffb"):
        with pytest.raises(EngineError) as caught:
            audio(codeclm, text=text)
        assert (caught.value.code, caught.value.detail["field"]) == ("invalid_request", "text")
        assert "surrogate" in str(caught.value)


def test_the_engine_declares_its_input_limits(codeclm):
    limits = codeclm.description["limits"]
    assert limits["text_bytes"] == 600
    assert limits["voice_sample_rate"] == [8_000, 192_000]
    with pytest.raises(EngineError) as caught:
        audio(codeclm, text="é" * 301)
    assert caught.value.detail == {"field": "text", "limit": 600, **caught.value.detail}


def test_the_command_line_reads_a_voice_path_from_the_current_folder(tmp_path, monkeypatch, capsys):
    """At the command line the operator names the voice: no voices.roots setting is needed."""
    from mizuoto_sdk.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MIZUOTO_SETTINGS", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    assert main(["synth", "sine", "a voice to clone", "-o", "me.wav", "--seed", "1"]) == 0
    assert main(["voice", "prepare", "codeclm", "me.wav", "-o", "voices/me"]) == 0
    argv = ["synth", "codeclm", "hello", "--seed", "3", "-o", "out.wav"]
    assert main([*argv, "--voice", "voices/me"]) == 0
    with_voice = (tmp_path / "out.wav").read_bytes()
    assert main(argv) == 0
    assert (tmp_path / "out.wav").read_bytes() != with_voice  # the voice was used
    assert main([*argv, "--voice", "voices/nobody"]) == 2
    assert "params.voice" in capsys.readouterr().err
