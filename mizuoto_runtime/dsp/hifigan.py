"""HiFi-GAN's mel spectrogram, bitwise equal to ``meldataset.mel_spectrogram``.

The function HiFi-GAN (jik876/hifi-gan) published, and CosyVoice, BigVGAN and Matcha-TTS copy,
computes a vocoder's input and its mel loss: reflect padding of ``(n_fft - hop_size) / 2`` on
both sides, ``torch.stft`` with ``torch.hann_window(win_size)`` (made on the CPU, moved to the
audio's device) and ``center=False`` by default, magnitude ``sqrt(re² + im² + 1e-9)``, the
librosa Slaney filters as float32, and ``log(clamp(x, min=1e-5))``. Here every step is the same
torch operation in the same order, so the result has the same bits for a [B, T] float32 input;
tests/runtime/test_dsp_hifigan.py writes upstream's function out and compares.

Upstream takes [B, T] only (it pads ``y.unsqueeze(1)``); [T] and [..., T] work here, flattened
to [B, T]. Upstream's float32 filters cannot multiply float64 spectra; float64 input is computed
in float64 here. Autograd flows through, as a training loss needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mizuoto_runtime.dsp import _checks
from mizuoto_runtime.dsp.fourier import as_tensor, hann_window, mel_basis


def hifigan_mel(
    y: torch.Tensor,
    *,
    n_fft: int,
    num_mels: int,
    sampling_rate: int,
    hop_size: int,
    win_size: int,
    fmin: float,
    fmax: float | None,
    center: bool = False,
) -> torch.Tensor:
    """[..., num_mels, frames] log-mel of ``y`` [..., T], with upstream's parameter names."""
    y = as_tensor("y", y)
    if y.ndim < 1:
        raise ValueError(f"y: expected samples [..., T], got shape {tuple(y.shape)}")
    n_fft = _checks.positive_int("n_fft", n_fft)
    num_mels = _checks.positive_int("num_mels", num_mels)
    sample_rate = _checks.positive_number("sampling_rate", sampling_rate)
    hop_size = _checks.positive_int("hop_size", hop_size)
    win_size = _checks.positive_int("win_size", win_size)
    _checks.window_fits(n_fft, win_size)
    low, high = _checks.band(sample_rate, fmin, fmax)
    if hop_size > n_fft:
        raise ValueError(f"hop_size: expected at most n_fft ({n_fft}), got {hop_size}")
    padding = int((n_fft - hop_size) / 2)
    if y.shape[-1] <= padding or (center and y.shape[-1] + 2 * padding <= n_fft // 2):
        raise ValueError(
            f"y: expected more than {padding} samples (the reflect padding), got {y.shape[-1]}"
        )
    leading = y.shape[:-1]
    batch = y.reshape(-1, y.shape[-1])
    device, dtype = batch.device, batch.dtype
    window = hann_window(win_size, device, dtype, periodic=True, made_on_cpu=True)
    filters = mel_basis(sample_rate, n_fft, num_mels, low, high, device, dtype)
    batch = F.pad(batch.unsqueeze(1), (padding, padding), mode="reflect").squeeze(1)
    spec = torch.stft(
        batch,
        n_fft,
        hop_length=hop_size,
        win_length=win_size,
        window=window,
        center=center,
        pad_mode="reflect",
        normalized=False,
        onesided=True,
        return_complex=True,
    )
    spec = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    mel = torch.log(torch.clamp(torch.matmul(filters, spec), min=1e-5))
    return mel.reshape(*leading, *mel.shape[-2:])
