"""Audio the host hands on: PCM chunks at their documented scale, WAV files that round-trip."""

from __future__ import annotations

import wave

import numpy as np
import pytest
import torch

from mizuoto_sdk.audio import to_mono_float32, write_wav

EXTREMES = np.array([-32768, -32767, -1, 0, 1, 32766, 32767], np.int16)


def random_int16(seed: int, count: int = 45_245) -> np.ndarray:
    samples = np.random.default_rng(seed).integers(-32768, 32768, count, dtype=np.int16)
    return np.concatenate([EXTREMES, samples])


def read_int16(path) -> np.ndarray:
    with wave.open(str(path), "rb") as source:
        assert (source.getsampwidth(), source.getnchannels()) == (2, 1)
        return np.frombuffer(source.readframes(source.getnframes()), "<i2")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_int16_read_at_the_usual_scale_is_written_back_bit_for_bit(tmp_path, seed):
    pcm = random_int16(seed)
    samples = to_mono_float32(pcm)
    np.testing.assert_array_equal(samples, pcm.astype(np.float32) / 32768)
    write_wav(tmp_path / "out.wav", samples, 16000)
    np.testing.assert_array_equal(read_int16(tmp_path / "out.wav"), pcm)


def test_the_wav_writer_rounds_to_nearest_and_clips_to_the_int16_range(tmp_path):
    samples = np.array([1.0, 2.0, -1.0, -3.0, 0.5, 1.4 / 32768, 1.6 / 32768, -np.inf], np.float32)
    write_wav(tmp_path / "out.wav", samples, 8000)
    expected = [32767, 32767, -32768, -32768, 16384, 1, 2, -32768]
    np.testing.assert_array_equal(read_int16(tmp_path / "out.wav"), expected)


def test_int32_pcm_is_read_at_full_scale_2_to_the_31():
    pcm = np.array([-(2**31), -(2**30), 0, 2**16, 2**31 - 1], np.int32)
    np.testing.assert_array_equal(
        to_mono_float32(pcm), np.array([-1.0, -0.5, 0.0, 2**-15, 1.0], np.float32)
    )


def test_torch_pcm_and_stereo_pcm_become_float32_mono():
    pcm = torch.tensor([[-32768, 16384], [0, 16384]], dtype=torch.int16)
    mono = to_mono_float32(pcm)
    assert mono.dtype == np.float32
    np.testing.assert_array_equal(mono, [-0.5, 0.5])


def test_unsigned_or_wide_integers_are_refused_naming_the_dtype():
    for dtype in (np.uint16, np.int64):
        with pytest.raises(TypeError, match=f"int16/int32 PCM, got dtype {np.dtype(dtype)}"):
            to_mono_float32(np.zeros(3, dtype))
