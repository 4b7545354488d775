"""Whisper's log-mel input features, bitwise equal to ``whisper.audio.log_mel_spectrogram``.

openai-whisper (20250625) frames 16 kHz audio with a 400-sample periodic Hann window (made on the
CPU in float32, then moved to the audio's device), a 160-sample hop and torch's centred, reflect
padded ``torch.stft``; drops the last frame; projects the power spectrum onto the mel filters it
ships in ``mel_filters.npz``; and compresses with ``log10``, clamped 8 (decades) below the
largest value of the whole input, then shifted and scaled by 4. The shipped filters are
``librosa.filters.mel(sr=16000, n_fft=400, n_mels=...)`` in float32, which ``mel_filters``
reproduces bit for bit (tests/runtime/test_dsp_whisper.py reads the npz to prove it), so the same
torch operations in the same order give the same bits.

Upstream takes float32 only. float64 audio is computed here in float64 throughout (the float32
filters widened), which upstream would refuse.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mizuoto_runtime.dsp import _checks
from mizuoto_runtime.dsp.fourier import as_tensor, hann_window, mel_basis

SAMPLE_RATE = 16_000
N_FFT = 400
HOP_LENGTH = 160


def whisper_log_mel(
    audio: torch.Tensor | np.ndarray, n_mels: int = 80, padding: int = 0
) -> torch.Tensor:
    """[..., n_mels, frames] log-mel of 16 kHz ``audio`` [..., T] (torch or numpy), zero padded
    by ``padding`` samples on the right first.

    ``n_mels`` is 80 (Whisper up to large-v2) or 128 (large-v3). As upstream, the floor at 8 below
    the maximum is taken over the whole input, every item of a batch together; call once per item
    for per-item floors. The output is on the audio's device.
    """
    audio = as_tensor("audio", audio)
    if audio.ndim < 1:
        raise ValueError(f"audio: expected samples [..., T], got shape {tuple(audio.shape)}")
    if n_mels not in (80, 128):
        raise ValueError(f"n_mels: expected 80 or 128 (Whisper's two filter banks), got {n_mels!r}")
    padding = _checks.non_negative_int("padding", padding)
    if audio.shape[-1] + padding <= N_FFT // 2:
        raise ValueError(
            f"audio: expected more than {N_FFT // 2} samples with padding (the centred frames "
            f"reflect that many), got {audio.shape[-1]} + {padding}"
        )
    leading = audio.shape[:-1]
    audio = audio.reshape(-1, audio.shape[-1]) if audio.ndim > 2 else audio
    if padding > 0:
        audio = F.pad(audio, (0, padding))
    device, dtype = audio.device, audio.dtype
    window = hann_window(N_FFT, device, dtype, periodic=True, made_on_cpu=True)
    spectrum = torch.stft(audio, N_FFT, HOP_LENGTH, window=window, return_complex=True)
    magnitudes = spectrum[..., :-1].abs() ** 2
    filters = mel_basis(float(SAMPLE_RATE), N_FFT, n_mels, 0.0, SAMPLE_RATE / 2, device, dtype)
    log_spec = torch.clamp(filters @ magnitudes, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    log_spec = (log_spec + 4.0) / 4.0
    return log_spec.reshape(*leading, *log_spec.shape[-2:])
