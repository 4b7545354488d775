"""Mel filter banks and mel spectrograms bitwise equal to librosa 0.11's, with numpy alone.

``mel_filters`` equals ``librosa.filters.mel`` and ``melspectrogram`` equals
``librosa.feature.melspectrogram`` (window ``"hann"``) bit for bit: every step is the numpy
operation librosa runs, on arrays of the same dtype, in the same order, so even the rounding is
the same.

- Filters: the mel scale (Slaney's, or HTK's) is evaluated in float64 at ``n_mels + 2`` points
  spaced evenly between ``fmin`` and ``fmax``; each triangle is cut to float32, then scaled by
  its Slaney area norm in float64 and cut again (or divided by its p-norm, as
  ``librosa.util.normalize`` does).
- Spectrogram: ``scipy.signal.get_window("hann", win_length)`` (periodic) is
  ``0.5 + 0.5 * cos(linspace(-pi, pi, win_length + 1))[:-1]``, computed here without scipy and
  zero-padded to ``n_fft`` in the middle. Frames are taken as librosa takes them (with
  ``center``, the head and tail frames come from separately padded ends of the signal, which
  matters only for ``pad_mode="reflect"`` on very short tails). Each frame times the float64
  window goes through numpy's float64 ``rfft``; the result is stored as complex64 for float32
  input, so the magnitude is float32 and the mel product is numpy's float32 ``einsum``.

Filter banks are kept per setting in a bounded, thread-safe cache and never written to; the
public function returns a copy.
"""

from __future__ import annotations

import functools
import numbers
import warnings
from typing import Literal, cast, get_args

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from mizuoto_runtime.dsp import _checks

Norm = Literal["slaney"] | float | None

PadMode = Literal["constant", "edge", "reflect", "symmetric"]
_PAD_MODES: tuple[str, ...] = get_args(PadMode)
_F_SP = 200.0 / 3  # Slaney's scale: linear below 1 kHz, 200/3 Hz per mel
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = np.log(6.4) / 27.0
_BLOCK_BYTES = 2**18


def mel_filters(
    sample_rate: float,
    n_fft: int,
    n_mels: int,
    *,
    fmin: float = 0.0,
    fmax: float | None = None,
    htk: bool = False,
    norm: Norm = "slaney",
) -> np.ndarray:
    """float32 [n_mels, 1 + n_fft // 2]: ``librosa.filters.mel(sr=sample_rate, ...)``, bitwise.

    ``fmax`` None is ``sample_rate / 2``; ``norm`` is ``"slaney"`` (area), None, or a p-norm
    (any number librosa's ``normalize`` accepts, ``np.inf`` included) along each filter.
    """
    sample_rate = _checks.positive_number("sample_rate", sample_rate)
    n_fft = _checks.positive_int("n_fft", n_fft)
    n_mels = _checks.positive_int("n_mels", n_mels)
    fmin, fmax = _checks.band(sample_rate, fmin, fmax)
    return _filters(sample_rate, n_fft, n_mels, fmin, fmax, bool(htk), _norm(norm)).copy()


def melspectrogram(
    y: np.ndarray,
    *,
    sr: float,
    n_fft: int,
    hop_length: int,
    win_length: int | None = None,
    n_mels: int,
    fmin: float = 0.0,
    fmax: float | None = None,
    power: float = 2.0,
    center: bool = True,
    pad_mode: str = "constant",
    htk: bool = False,
    norm: Norm = "slaney",
) -> np.ndarray:
    """[..., n_mels, frames] of ``y`` [..., T]: ``librosa.feature.melspectrogram``, bitwise.

    float32 input gives float32 (librosa's complex64 path), float64 gives float64. ``win_length``
    None is ``n_fft``; ``pad_mode`` (with ``center``) is one of numpy's ``constant``, ``edge``,
    ``reflect``, ``symmetric``.
    """
    y = np.asarray(y)
    if y.ndim < 1 or y.shape[-1] < 1:
        raise ValueError(f"y: expected samples [..., T] with T >= 1, got shape {y.shape}")
    if y.dtype not in (np.float32, np.float64):
        raise ValueError(f"y: expected float32 or float64 samples, got {y.dtype}")
    if not np.isfinite(y).all():
        raise ValueError("y: expected finite samples, got NaN or infinity")
    sr = _checks.positive_number("sr", sr)
    n_fft = _checks.positive_int("n_fft", n_fft)
    hop_length = _checks.positive_int("hop_length", hop_length)
    win_length = n_fft if win_length is None else _checks.positive_int("win_length", win_length)
    _checks.window_fits(n_fft, win_length)
    n_mels = _checks.positive_int("n_mels", n_mels)
    fmin, fmax = _checks.band(sr, fmin, fmax)
    if isinstance(power, bool) or not isinstance(power, numbers.Real) or power <= 0:
        raise ValueError(
            f"power: expected a number > 0 (2 for power, 1 for magnitude), got {power!r}"
        )
    if pad_mode not in _PAD_MODES:
        raise ValueError(f"pad_mode: expected one of {', '.join(_PAD_MODES)}, got {pad_mode!r}")
    if not center and y.shape[-1] < n_fft:
        raise ValueError(
            f"y: expected at least n_fft ({n_fft}) samples without center, got {y.shape[-1]}"
        )
    basis = _filters(sr, n_fft, n_mels, fmin, fmax, bool(htk), _norm(norm))
    frames = _stft(y, n_fft, hop_length, win_length, bool(center), cast(PadMode, pad_mode))
    spectrum = np.abs(frames) ** power
    return np.einsum("...ft,mf->...mt", spectrum, basis, optimize=True)


def _norm(norm: object) -> str | float | None:
    if norm is None:
        return None
    if norm == "slaney":
        return "slaney"
    if (
        isinstance(norm, bool)
        or not isinstance(norm, numbers.Real)
        or not (float(norm) > 0 or float(norm) in (0.0, -np.inf))
    ):
        raise ValueError(
            f"norm: expected 'slaney', None or a p-norm order (> 0, 0, inf or -inf), got {norm!r}"
        )
    return float(norm)


def _hz_to_mel(hz: np.ndarray, htk: bool) -> np.ndarray:
    if htk:
        return 2595.0 * np.log10(1.0 + hz / 700.0)
    mels = hz / _F_SP
    high = hz >= _MIN_LOG_HZ
    mels[high] = _MIN_LOG_MEL + np.log(hz[high] / _MIN_LOG_HZ) / _LOGSTEP
    return mels


def _mel_to_hz(mels: np.ndarray, htk: bool) -> np.ndarray:
    if htk:
        return 700.0 * (10.0 ** (mels / 2595.0) - 1.0)
    hz = _F_SP * mels
    high = mels >= _MIN_LOG_MEL
    hz[high] = _MIN_LOG_HZ * np.exp(_LOGSTEP * (mels[high] - _MIN_LOG_MEL))
    return hz


@functools.lru_cache(maxsize=64)
def _filters(
    sample_rate: float,
    n_fft: int,
    n_mels: int,
    fmin: float,
    fmax: float,
    htk: bool,
    norm: str | float | None,
) -> np.ndarray:
    """The bank, read-only: callers share it."""
    fft_hz = np.fft.rfftfreq(n=n_fft, d=1.0 / sample_rate)
    # Each edge on its own, as librosa converts the two scalars.
    low, high = (_hz_to_mel(np.array([edge]), htk)[0] for edge in (fmin, fmax))
    mel_hz = _mel_to_hz(np.linspace(low, high, n_mels + 2), htk)
    widths = np.diff(mel_hz)
    ramps = np.subtract.outer(mel_hz, fft_hz)  # [n_mels + 2, bins]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(rising, falling)).astype(np.float32)
    if norm == "slaney":
        weights *= (2.0 / (mel_hz[2:] - mel_hz[:-2]))[:, None]  # float64 product, float32 result
    elif norm is not None:
        weights = _p_normalize(weights, float(norm))
    if not np.all((mel_hz[:-2] == 0) | (weights.max(axis=1) > 0)):
        warnings.warn(
            f"mel_filters: some of the {n_mels} filters are empty (all zero) at n_fft={n_fft}; "
            "use fewer mels or a larger n_fft",
            UserWarning,
            stacklevel=4,
        )
    weights.flags.writeable = False
    return weights


def _p_normalize(weights: np.ndarray, order: float) -> np.ndarray:
    """Each row over its ``order``-norm in float64, rows of norm below float32's tiny left alone."""
    magnitude = np.abs(weights).astype(np.float64)
    if order == np.inf:
        length = magnitude.max(axis=-1, keepdims=True)
    elif order == -np.inf:
        length = magnitude.min(axis=-1, keepdims=True)
    elif order == 0:
        length = np.sum(magnitude > 0, axis=-1, keepdims=True, dtype=np.float64)
    else:
        length = np.sum(magnitude**order, axis=-1, keepdims=True) ** (1.0 / order)
    length[length < np.finfo(np.float32).tiny] = 1.0
    out = np.empty_like(weights)
    out[:] = weights / length
    return out


@functools.lru_cache(maxsize=32)
def _hann(length: int) -> np.ndarray:
    """``scipy.signal.get_window("hann", length)`` (periodic), bitwise: scipy adds 0.5 times
    cos(0) = 1 to zeros, then 0.5 times the cosine."""
    if length == 1:
        window = np.ones(1)
    else:
        window = (0.5 + 0.5 * np.cos(np.linspace(-np.pi, np.pi, length + 1)))[:-1]
    window.flags.writeable = False
    return window


@functools.lru_cache(maxsize=32)
def _centred_window(n_fft: int, win_length: int) -> np.ndarray:
    """[n_fft, 1]: the window in the middle of the frame, as a column over the frame's samples."""
    left = (n_fft - win_length) // 2
    window = np.pad(_hann(win_length), (left, n_fft - win_length - left))[:, None]
    window.flags.writeable = False
    return window


def _frames(y: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """[..., n_fft, frames] view of every full frame of ``y``."""
    return np.swapaxes(sliding_window_view(y, n_fft, axis=-1)[..., ::hop, :], -1, -2)


def _stft(
    y: np.ndarray, n_fft: int, hop: int, win_length: int, center: bool, pad_mode: PadMode
) -> np.ndarray:
    """[..., 1 + n_fft // 2, frames] complex, framed and transformed as ``librosa.stft``."""
    half = n_fft // 2
    widths = [(0, 0)] * (y.ndim - 1)
    head: np.ndarray | None = None
    tail: np.ndarray | None = None
    if center:
        first_inside = -(-half // hop)  # frames before this one reach into the head padding
        first_tail = (y.shape[-1] + half - n_fft) // hop + 1  # and from this one the tail's
        if first_tail <= first_inside:
            y, start = np.pad(y, [*widths, (half, half)], mode=pad_mode), 0
        else:
            start = first_inside * hop - half
            head_samples = y[..., : (first_inside - 1) * hop - half + n_fft + 1]
            head = np.pad(head_samples, [*widths, (half, 0)], mode=pad_mode)
            head = _frames(head, n_fft, hop)[..., :first_inside]
            if first_tail * hop - half + n_fft <= y.shape[-1] + half:
                tail_samples = y[..., first_tail * hop - half :]
                tail = _frames(
                    np.pad(tail_samples, [*widths, (0, half)], mode=pad_mode), n_fft, hop
                )
    else:
        start = 0
    middle = _frames(y[..., start:], n_fft, hop)
    parts = [part for part in (head, middle, tail) if part is not None]
    count = sum(part.shape[-1] for part in parts)
    complex_type = np.complex64 if y.dtype == np.float32 else np.complex128
    out = np.zeros((*y.shape[:-1], 1 + half, count), complex_type, order="F")
    window = _centred_window(n_fft, win_length)
    # In blocks of about 256 KiB of input, as librosa: the same values, and faster in cache.
    block = max(1, _BLOCK_BYTES // (int(np.prod(y.shape[:-1])) * n_fft * y.itemsize))
    done = 0
    for part in parts:
        for start in range(0, part.shape[-1], block):
            chunk = part[..., start : start + block]
            out[..., done : done + chunk.shape[-1]] = np.fft.rfft(window * chunk, axis=-2)
            done += chunk.shape[-1]
    return out
