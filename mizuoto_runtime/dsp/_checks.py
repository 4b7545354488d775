"""Argument checks shared by the dsp functions: each failure is a ValueError naming the argument."""

from __future__ import annotations

import numbers


def positive_int(name: str, value: object) -> int:
    """``value`` as an int >= 1, or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    return int(value)


def non_negative_int(name: str, value: object) -> int:
    """``value`` as an int >= 0, or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name}: expected an integer >= 0, got {value!r}")
    return int(value)


def positive_number(name: str, value: object) -> float:
    """``value`` as a finite float > 0, or a ValueError naming ``name``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not 0 < float(value) < float("inf")
    ):
        raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")
    return float(value)


def band(sample_rate: float, fmin: object, fmax: object) -> tuple[float, float]:
    """``(fmin, fmax)`` with ``fmax`` None meaning Nyquist; 0 <= fmin < fmax <= sample_rate / 2."""
    nyquist = float(sample_rate) / 2
    if (
        isinstance(fmin, bool)
        or not isinstance(fmin, numbers.Real)
        or not 0 <= float(fmin) < nyquist
    ):
        raise ValueError(f"fmin: expected a frequency in [0, {nyquist:g}) Hz, got {fmin!r}")
    if fmax is None:
        return float(fmin), nyquist
    if (
        isinstance(fmax, bool)
        or not isinstance(fmax, numbers.Real)
        or not float(fmin) < float(fmax) <= nyquist
    ):
        raise ValueError(
            f"fmax: expected a frequency in ({float(fmin):g}, {nyquist:g}] Hz (above fmin, at most "
            f"sample_rate / 2), got {fmax!r}"
        )
    return float(fmin), float(fmax)


def window_fits(n_fft: int, win_length: int) -> None:
    """The window must fit in the FFT frame."""
    if win_length > n_fft:
        raise ValueError(f"n_fft: expected at least win_length ({win_length}), got {n_fft}")
