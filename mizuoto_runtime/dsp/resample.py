"""Band-limited resampling between any two sample rates, in blocks that honour cancel.

It equals no upstream package: it is the runtime's own Kaiser-windowed sinc (not librosa's soxr,
torchaudio's ``resample`` or scipy's ``resample_poly``), tested against the same sinc evaluated
directly at every output instant in float64.

A voice recording arrives at whatever rate its device used, and an engine wants its own. The
resampler is a Kaiser-windowed sinc evaluated at each output instant: output sample ``n`` sits at
input time ``n * down / up`` (the rates' ratio in lowest terms), so its filter depends only on the
phase ``(n * down) mod up``. The filters of all phases form a bank computed once.

When the rates share a large factor (44.1 kHz -> 16 kHz: 160 phases) every phase gets its exact
filter. An odd rate (999983 Hz -> 16 kHz: 16000 phases) would need a bank too large to compute,
so phases are rounded to the nearest of ``PHASES`` evenly spaced ones: an output instant moves by
at most 1/(2 * PHASES) of an input sample, an error below -68 dB at the highest frequency kept.
The work is then proportional to the input's length (about 32 multiply-adds per input sample
when shrinking the rate) whatever the rates are, and it runs in blocks that each check the bound
request's cancel, so a timeout or cancel stops a long resample within one block.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from mizuoto_runtime.context import current_context

PHASES = 4096  # at most this many distinct filters; beyond it, phases are rounded
ZERO_CROSSINGS = 16  # filter taps on each side, in zero crossings of the lowpass sinc
BETA = 8.0  # the Kaiser window's shape: about 80 dB of stopband
_BLOCK_VALUES = 2**21  # outputs x taps per block: 16 MiB of float64, a few ms of work


def resample(samples: np.ndarray, source_rate: int, target_rate: int) -> np.ndarray:
    """``samples`` [n] at ``source_rate`` as float32 [n * target_rate // source_rate].

    Frequencies above the lower Nyquist frequency are removed. Raises ``ValueError`` for rates
    that are not positive integers or samples that are not one-dimensional; raises the bound
    request's ``CancelledError`` or ``OperationTimeoutError`` between blocks.
    """
    for name, rate in (("source_rate", source_rate), ("target_rate", target_rate)):
        if isinstance(rate, bool) or not isinstance(rate, numbers.Integral) or rate < 1:
            raise ValueError(f"{name}: expected an integer >= 1 (Hz), got {rate!r}")
    samples = np.asarray(samples)
    if samples.ndim != 1:
        raise ValueError(f"samples: expected one dimension [n], got shape {samples.shape}")
    source_rate, target_rate = int(source_rate), int(target_rate)
    if source_rate == target_rate:
        return samples.astype(np.float32)
    common = math.gcd(source_rate, target_rate)
    up, down = target_rate // common, source_rate // common
    cutoff = min(1.0, up / down)  # below both Nyquist frequencies
    half = math.ceil(ZERO_CROSSINGS / cutoff)
    count = len(samples) * up // down
    phases = min(up, PHASES)
    bank = _bank(phases, half, cutoff)  # [phases, taps]
    padded = np.pad(samples.astype(np.float64), (half, half + 2))
    taps = np.arange(-half + 1, half + 1)
    out = np.empty(count, np.float64)
    block = max(1, _BLOCK_VALUES // len(taps))
    for start in range(0, count, block):
        _check_cancel()
        position = np.arange(start, min(start + block, count), dtype=np.int64) * down
        base, phase = position // up, position % up
        if phases != up:  # round each phase to the grid; the last step rolls to the next sample
            phase = (phase * phases + up // 2) // up
            base, phase = base + phase // phases, phase % phases
        gathered = padded[base[:, None] + taps + half]  # [block, taps]
        out[start : start + len(base)] = np.einsum("bt,bt->b", gathered, bank[phase])
    return out.astype(np.float32)


def _bank(phases: int, half: int, cutoff: float) -> np.ndarray:
    """[phases, 2 * half] filters; row p is the lowpass at input offsets ``taps - p / phases``."""
    taps = np.arange(-half + 1, half + 1)
    bank = np.empty((phases, len(taps)), np.float64)
    rows = max(1, _BLOCK_VALUES // (4 * len(taps)))  # the window costs more than a multiply-add
    for start in range(0, phases, rows):
        _check_cancel()
        phase = np.arange(start, min(start + rows, phases))
        offset = taps[None, :] - phase[:, None] / phases  # input minus output time
        window = np.i0(BETA * np.sqrt(np.clip(1 - (offset / half) ** 2, 0, None))) / np.i0(BETA)
        bank[start : start + len(phase)] = cutoff * np.sinc(cutoff * offset) * window
    return bank


def _check_cancel() -> None:
    ctx = current_context()
    if ctx is not None:
        ctx.check_cancel()
