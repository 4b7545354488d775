"""``torch.stft`` / ``torch.istft`` with a Hann window by default, and the tensors the dsp shares.

``stft`` and ``istft`` are ``torch.stft`` and ``torch.istft`` themselves, bitwise: they only fill
in what upstream code always passes (``return_complex=True``, ``window=torch.hann_window(
win_length)`` on the input's device and dtype, where torch's own default would be a rectangular
window) and accept any leading dimensions, flattened into the one batch dimension torch takes.

The windows and filter banks the dsp functions use are built once per (settings, device, dtype)
in bounded ``functools.lru_cache`` caches, which are safe to call from many threads. They are
built outside inference mode (a tensor made inside it could not take part in autograd later, as
a training loss on generated audio needs) and nothing ever writes to them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch

from mizuoto_runtime.dsp import _checks
from mizuoto_runtime.dsp.mel import _filters


def stft(
    input: torch.Tensor,
    n_fft: int,
    hop_length: int | None = None,
    win_length: int | None = None,
    window: torch.Tensor | None = None,
    *,
    center: bool = True,
    pad_mode: str = "reflect",
    normalized: bool = False,
    onesided: bool | None = None,
    return_complex: bool = True,
) -> torch.Tensor:
    """``torch.stft`` of ``input`` [..., T] -> [..., bins, frames]; window None is Hann(win_length).

    ``hop_length`` None is ``win_length // 4``, ``win_length`` None is ``n_fft``, as in torch.
    """
    if not isinstance(input, torch.Tensor) or input.ndim < 1:
        raise ValueError(f"input: expected a tensor [..., T], got {_describe(input)}")
    n_fft = _checks.positive_int("n_fft", n_fft)
    win_length = n_fft if win_length is None else _checks.positive_int("win_length", win_length)
    _checks.window_fits(n_fft, win_length)
    if hop_length is not None:
        hop_length = _checks.positive_int("hop_length", hop_length)
    if window is None:
        window = hann_window(win_length, input.device, _real_dtype(input.dtype), periodic=True)
    spectrum = torch.stft(
        input.reshape(-1, input.shape[-1]),
        n_fft,
        hop_length,
        win_length,
        window,
        center=center,
        pad_mode=pad_mode,
        normalized=normalized,
        onesided=onesided,
        return_complex=return_complex,
    )
    return spectrum.reshape(*input.shape[:-1], *spectrum.shape[1:])


def istft(
    input: torch.Tensor,
    n_fft: int,
    hop_length: int | None = None,
    win_length: int | None = None,
    window: torch.Tensor | None = None,
    *,
    center: bool = True,
    normalized: bool = False,
    onesided: bool | None = None,
    length: int | None = None,
    return_complex: bool = False,
) -> torch.Tensor:
    """``torch.istft`` of ``input`` [..., bins, frames] -> [..., T]; window None is Hann."""
    if not isinstance(input, torch.Tensor) or input.ndim < 2 or not input.is_complex():
        raise ValueError(
            f"input: expected a complex tensor [..., bins, frames], got {_describe(input)}"
        )
    n_fft = _checks.positive_int("n_fft", n_fft)
    win_length = n_fft if win_length is None else _checks.positive_int("win_length", win_length)
    _checks.window_fits(n_fft, win_length)
    if hop_length is not None:
        hop_length = _checks.positive_int("hop_length", hop_length)
    if window is None:
        window = hann_window(win_length, input.device, _real_dtype(input.dtype), periodic=True)
    signal = torch.istft(
        input.reshape(-1, *input.shape[-2:]),
        n_fft,
        hop_length,
        win_length,
        window,
        center=center,
        normalized=normalized,
        onesided=onesided,
        length=length,
        return_complex=return_complex,
    )
    return signal.reshape(*input.shape[:-2], signal.shape[-1])


@functools.lru_cache(maxsize=64)
def hann_window(
    length: int,
    device: torch.device,
    dtype: torch.dtype,
    *,
    periodic: bool,
    made_on_cpu: bool = False,
) -> torch.Tensor:
    """``torch.hann_window(length, periodic=periodic)`` made on ``device`` in ``dtype``, shared.

    ``made_on_cpu``: computed on the CPU and then moved, as upstreams that write
    ``torch.hann_window(n).to(device)`` get it.
    """
    where = torch.device("cpu") if made_on_cpu else device
    return _build(
        lambda: torch.hann_window(length, periodic=periodic, device=where, dtype=dtype).to(device)
    )


@functools.lru_cache(maxsize=64)
def mel_basis(
    sample_rate: float,
    n_fft: int,
    n_mels: int,
    fmin: float,
    fmax: float,
    device: torch.device,
    dtype: torch.dtype,
) -> torch.Tensor:
    """librosa's Slaney-normalised float32 bank (``mel_filters``) as a tensor on ``device``."""
    bank: np.ndarray = _filters(sample_rate, n_fft, n_mels, fmin, fmax, False, "slaney")
    return _build(lambda: torch.from_numpy(bank.copy()).to(device=device, dtype=dtype))


def as_tensor(name: str, samples: object) -> torch.Tensor:
    """A float tensor of ``samples`` (a tensor or a numpy array), sharing memory where it can."""
    if isinstance(samples, np.ndarray):
        samples = torch.from_numpy(samples)
    if not isinstance(samples, torch.Tensor):
        raise ValueError(
            f"{name}: expected a torch tensor or a numpy array, got {_describe(samples)}"
        )
    if samples.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"{name}: expected float32 or float64 samples, got {samples.dtype}")
    return samples


def _build(make: Callable[[], torch.Tensor]) -> torch.Tensor:
    with torch.inference_mode(False), torch.no_grad():
        return make()


def _real_dtype(dtype: torch.dtype) -> torch.dtype:
    return {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)


def _describe(value: object) -> str:
    shape = getattr(value, "shape", None)
    return type(value).__name__ + ("" if shape is None else f" of shape {tuple(shape)}")
