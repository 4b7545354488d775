"""whisper_log_mel: bitwise equal to openai-whisper's log_mel_spectrogram, run here."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import whisper.audio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mizuoto_runtime.dsp import mel_filters, whisper_log_mel


@pytest.mark.parametrize("n_mels", [80, 128])
def test_the_filters_are_the_ones_whisper_ships(n_mels):
    shipped = os.path.join(os.path.dirname(whisper.audio.__file__), "assets", "mel_filters.npz")
    with np.load(shipped, allow_pickle=False) as files:
        theirs = files[f"mel_{n_mels}"]
    ours = mel_filters(16_000, 400, n_mels)
    assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(
    length=st.integers(201, 40_000),
    batch=st.sampled_from([(), (1,), (3,)]),
    n_mels=st.sampled_from([80, 128]),
    padding=st.sampled_from([0, 1, 160, 4_801]),
    scale=st.sampled_from([1e-4, 0.3, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_equals_whisper_bitwise(length, batch, n_mels, padding, scale, seed):
    samples = np.random.default_rng(seed).standard_normal((*batch, length)) * scale
    audio = torch.from_numpy(samples.astype(np.float32))
    theirs = whisper.audio.log_mel_spectrogram(audio, n_mels, padding)
    assert torch.equal(whisper_log_mel(audio, n_mels, padding), theirs)
    assert torch.equal(whisper_log_mel(audio.numpy(), n_mels, padding), theirs)


def test_leading_dimensions_flatten_into_whisper_s_batch():
    audio = torch.randn(2, 3, 3_000, generator=torch.Generator().manual_seed(0))
    theirs = whisper.audio.log_mel_spectrogram(audio.reshape(6, 3_000))
    assert torch.equal(whisper_log_mel(audio), theirs.reshape(2, 3, 80, -1))


def test_float64_is_computed_in_float64_close_to_float32():
    audio = torch.randn(16_000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    wide = whisper_log_mel(audio)
    assert wide.dtype == torch.float64
    torch.testing.assert_close(wide.float(), whisper_log_mel(audio.float()), atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: whisper_log_mel(torch.zeros(1_000), 64), "n_mels"),
        (lambda: whisper_log_mel(torch.zeros(1_000), 80, -1), "padding"),
        (lambda: whisper_log_mel(torch.zeros(200)), "audio"),
        (lambda: whisper_log_mel(torch.zeros(())), "audio"),
        (lambda: whisper_log_mel(torch.zeros(1_000, dtype=torch.int16)), "audio"),
        (lambda: whisper_log_mel([0.0] * 1_000), "audio"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(call, argument):
    with pytest.raises(ValueError, match=rf"^{argument}: expected"):
        call()


@pytest.mark.cuda
def test_on_cuda_within_1e_4_of_whisper_on_the_cpu():
    audio = torch.from_numpy(
        np.random.default_rng(1).uniform(-1, 1, (2, 48_000)).astype(np.float32)
    )
    on_gpu = whisper_log_mel(audio.cuda(), 128)
    assert on_gpu.device.type == "cuda"
    theirs = whisper.audio.log_mel_spectrogram(audio, 128)
    torch.testing.assert_close(on_gpu.cpu(), theirs, atol=1e-4, rtol=0)
