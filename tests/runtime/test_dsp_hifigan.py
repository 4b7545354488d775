"""hifigan_mel: bitwise equal to HiFi-GAN's meldataset.mel_spectrogram, written out below."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from librosa.filters import mel as librosa_mel_fn

from mizuoto_runtime.dsp import hifigan_mel

# Upstream's function as BigVGAN (v2) publishes it, HiFi-GAN's with torch 2's return_complex; the
# caches are upstream's too, module-level dicts keyed by settings and device.
mel_basis_cache: dict = {}
hann_window_cache: dict = {}


def dynamic_range_compression_torch(x, C=1, clip_val=1e-5):
    return torch.log(torch.clamp(x, min=clip_val) * C)


def spectral_normalize_torch(magnitudes):
    return dynamic_range_compression_torch(magnitudes)


def mel_spectrogram(
    y, n_fft, num_mels, sampling_rate, hop_size, win_size, fmin, fmax, center=False
):
    if torch.min(y) < -1.0:
        print(f"[WARNING] Min value of input waveform signal is {torch.min(y)}")
    if torch.max(y) > 1.0:
        print(f"[WARNING] Max value of input waveform signal is {torch.max(y)}")

    device = y.device
    key = f"{n_fft}_{num_mels}_{sampling_rate}_{hop_size}_{win_size}_{fmin}_{fmax}_{device}"

    if key not in mel_basis_cache:
        mel = librosa_mel_fn(sr=sampling_rate, n_fft=n_fft, n_mels=num_mels, fmin=fmin, fmax=fmax)
        mel_basis_cache[key] = torch.from_numpy(mel).float().to(device)
        hann_window_cache[key] = torch.hann_window(win_size).to(device)

    mel_basis = mel_basis_cache[key]
    hann_window = hann_window_cache[key]

    padding = (n_fft - hop_size) // 2
    y = torch.nn.functional.pad(y.unsqueeze(1), (padding, padding), mode="reflect").squeeze(1)

    spec = torch.stft(
        y,
        n_fft,
        hop_length=hop_size,
        win_length=win_size,
        window=hann_window,
        center=center,
        pad_mode="reflect",
        normalized=False,
        onesided=True,
        return_complex=True,
    )
    spec = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)

    mel_spec = torch.matmul(mel_basis, spec)
    mel_spec = spectral_normalize_torch(mel_spec)

    return mel_spec


# HiFi-GAN (22.05 kHz), CosyVoice's HiFT (24 kHz, 1920/480), BigVGAN v2 (24 kHz 100 bands,
# 44.1 kHz 128 bands with fmax None), Matcha-TTS, and a window shorter than n_fft.
CONFIGS = [
    dict(
        n_fft=1024, num_mels=80, sampling_rate=22050, hop_size=256, win_size=1024, fmin=0, fmax=8000
    ),
    dict(
        n_fft=1920, num_mels=80, sampling_rate=24000, hop_size=480, win_size=1920, fmin=0, fmax=8000
    ),
    dict(
        n_fft=1024,
        num_mels=100,
        sampling_rate=24000,
        hop_size=256,
        win_size=1024,
        fmin=0,
        fmax=None,
    ),
    dict(
        n_fft=2048,
        num_mels=128,
        sampling_rate=44100,
        hop_size=512,
        win_size=2048,
        fmin=0,
        fmax=None,
    ),
    dict(
        n_fft=1024,
        num_mels=80,
        sampling_rate=22050,
        hop_size=256,
        win_size=800,
        fmin=20,
        fmax=11025,
    ),
]


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(
    config=st.sampled_from(CONFIGS),
    length=st.integers(1_100, 30_000),
    batch=st.integers(1, 3),
    center=st.booleans(),
    scale=st.sampled_from([1.0, 1e-2, 1e-4]),  # quiet audio, where the 1e-9 under the root counts
    seed=st.integers(0, 2**32 - 1),
)
def test_equals_upstream_bitwise(config, length, batch, center, scale, seed):
    samples = np.random.default_rng(seed).uniform(-scale, scale, (batch, length)).astype(np.float32)
    y = torch.from_numpy(samples)
    theirs = mel_spectrogram(y, **config, center=center)
    assert torch.equal(hifigan_mel(y, **config, center=center), theirs)
    # [T] is upstream's [1, T] (not a row of [B, T]: torch's batched matmul may round otherwise)
    single = mel_spectrogram(y[:1], **config, center=center)[0]
    assert torch.equal(hifigan_mel(y[0], **config, center=center), single)


def test_gradients_flow_even_when_the_cache_was_filled_in_inference_mode():
    config = CONFIGS[0]
    with torch.inference_mode():
        hifigan_mel(torch.zeros(1, 4_000), **config)
    y = torch.randn(1, 4_000, generator=torch.Generator().manual_seed(0)).mul(0.1).requires_grad_()
    hifigan_mel(y, **config).mean().backward()
    assert y.grad is not None and torch.isfinite(y.grad).all() and y.grad.abs().sum() > 0


def test_float64_is_computed_in_float64_close_to_float32():
    y = torch.rand(2, 8_000, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    wide = hifigan_mel(y * 2 - 1, **CONFIGS[1])
    assert wide.dtype == torch.float64
    torch.testing.assert_close(
        wide.float(), hifigan_mel((y * 2 - 1).float(), **CONFIGS[1]), atol=2e-4, rtol=0
    )


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ({"n_fft": 512}, "n_fft"),  # shorter than win_size
        ({"fmax": 12_000}, "fmax"),  # above 22050 / 2
        ({"sampling_rate": 0}, "sampling_rate"),
        ({"hop_size": 0}, "hop_size"),
        ({"num_mels": 0}, "num_mels"),
        ({"fmin": -5}, "fmin"),
        ({"y": torch.zeros(100)}, "y"),
        ({"y": torch.zeros(())}, "y"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(change, argument):
    arguments = {"y": torch.zeros(1, 4_000), **CONFIGS[0], **change}
    with pytest.raises(ValueError, match=rf"^{argument}: expected"):
        hifigan_mel(**arguments)


@pytest.mark.cuda
def test_on_cuda_within_1e_4_of_upstream_on_the_cpu():
    y = torch.from_numpy(np.random.default_rng(1).uniform(-1, 1, (2, 48_000)).astype(np.float32))
    on_gpu = hifigan_mel(y.cuda(), **CONFIGS[1])
    assert on_gpu.device.type == "cuda"
    torch.testing.assert_close(on_gpu.cpu(), mel_spectrogram(y, **CONFIGS[1]), atol=1e-4, rtol=0)
