"""resample: band-limited at any pair of rates, fast for odd ones, stopped by the bound cancel."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.dsp.resample import BETA, ZERO_CROSSINGS, resample
from mizuoto_sdk import CancelledError, OperationTimeoutError


def _reference(x: np.ndarray, source: int, target: int) -> np.ndarray:
    """The windowed sinc evaluated directly at every output instant, in float64."""
    cutoff = min(1.0, target / source)
    half = math.ceil(ZERO_CROSSINGS / cutoff)
    out = np.zeros(len(x) * target // source)
    for n in range(len(out)):
        t = n * source / target
        k = np.arange(math.floor(t) - half + 1, math.floor(t) + half + 1)
        offset = k - t
        window = np.i0(BETA * np.sqrt(np.clip(1 - (offset / half) ** 2, 0, None))) / np.i0(BETA)
        inside = (k >= 0) & (k < len(x))
        out[n] = np.sum(x[k[inside]] * (cutoff * np.sinc(cutoff * offset) * window)[inside])
    return out


def _tone(rate: int, hz: float, seconds: float) -> np.ndarray:
    return np.sin(2 * np.pi * hz * np.arange(round(rate * seconds)) / rate).astype(np.float32)


@pytest.mark.parametrize(
    ("source", "target"),
    [(44_100, 16_000), (16_000, 44_100), (48_000, 16_000), (22_050, 16_000), (8_000, 16_000)],
)
def test_rates_with_few_phases_evaluate_the_filter_exactly(source, target):
    x = np.random.default_rng(source).standard_normal(source // 20).astype(np.float32)
    np.testing.assert_allclose(
        resample(x, source, target), _reference(x, source, target), atol=2e-6
    )


@pytest.mark.parametrize(("source", "target"), [(999_983, 16_000), (16_001, 16_000), (7, 16_000)])
def test_odd_rates_round_phases_within_the_documented_error(source, target):
    x = np.random.default_rng(1).standard_normal(min(source, 40_000) // 4).astype(np.float32)
    error = np.abs(resample(x, source, target) - _reference(x, source, target)).max()
    assert error < 2e-3 * np.abs(x).max()  # 1/(2 * 4096) of a sample at the highest frequency


@pytest.mark.parametrize("source", [191_999, 999_983, 44_100, 12_345])
def test_a_tone_keeps_its_frequency_and_level(source):
    tone = _tone(source, 1000.0, 0.25)
    got = resample(tone, source, 16_000)
    want = _tone(16_000, 1000.0, 0.25)[: len(got)]
    assert len(got) == len(tone) * 16_000 // source
    middle = slice(100, len(got) - 100)  # away from the zero padding at either end
    np.testing.assert_allclose(got[middle], want[middle], atol=2e-3)


class _StopsAfter(RequestContext):
    """A context that cancels itself at its ``limit``-th check, counting every check."""

    def __init__(self, limit: int) -> None:
        super().__init__(seed=0)
        self.checks, self.limit = 0, limit

    def check_cancel(self) -> None:
        self.checks += 1
        if self.checks == self.limit:
            self.cancel("timeout")
        super().check_cancel()


def test_cancel_is_checked_as_the_work_goes_and_stops_it():
    x = np.random.default_rng(3).standard_normal(191_999 * 5).astype(np.float32)
    counting = _StopsAfter(limit=10**9)
    with counting.bind():
        resample(x, 191_999, 16_000)
    assert counting.checks >= 10  # in blocks, not once at the start
    stopping = _StopsAfter(limit=counting.checks // 2)
    with stopping.bind(), pytest.raises(OperationTimeoutError):
        resample(x, 191_999, 16_000)
    assert stopping.checks == counting.checks // 2
    cancelled = RequestContext(seed=0)
    cancelled.cancel()
    with cancelled.bind(), pytest.raises(CancelledError):
        resample(x[:100], 44_100, 16_000)


def test_outside_a_call_there_is_nothing_to_cancel_and_equal_rates_copy():
    x = np.arange(5, dtype=np.float64)
    same = resample(x, 16_000, 16_000)
    assert same.dtype == np.float32 and np.array_equal(same, x)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((np.zeros(4), 0, 16_000), "source_rate"),
        ((np.zeros(4), 16_000, -1), "target_rate"),
        ((np.zeros(4), 1.5, 16_000), "source_rate"),
        ((np.zeros((2, 4)), 8_000, 16_000), "samples"),
    ],
)
def test_bad_arguments_name_what_is_wrong(args, message):
    with pytest.raises(ValueError, match=message):
        resample(*args)
