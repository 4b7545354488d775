"""mel_filters and melspectrogram: bitwise equal to librosa itself, run here on random settings."""

from __future__ import annotations

import warnings

import librosa
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mizuoto_runtime.dsp import mel_filters, melspectrogram

RATES = (8_000, 16_000, 22_050, 24_000, 44_100, 48_000, 12_345)
NORMS = ("slaney", None, 1.0, 2.0, 3.5, np.inf, -np.inf, 0)
EXAMPLES = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def _identical(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    if not np.array_equal(ours, theirs):
        bits = np.int32 if ours.dtype == np.float32 else np.int64
        ulps = np.abs(ours.view(bits).astype(float) - theirs.view(bits))
        differ = int((ours != theirs).sum())
        raise AssertionError(f"not bitwise equal: {differ} values differ, by {ulps.max():g} ulp")


@st.composite
def filter_settings(draw: st.DrawFn) -> dict:
    rate = draw(st.sampled_from(RATES))
    fmin = draw(st.sampled_from([0.0, None]))
    if fmin is None:
        fmin = draw(st.floats(0.0, rate / 4, allow_nan=False))
    fmax = draw(st.sampled_from([None, "drawn"]))
    if fmax == "drawn":
        fmax = draw(st.floats(fmin + 1.0, rate / 2, allow_nan=False))
    return {
        "sample_rate": rate,
        "n_fft": draw(st.integers(16, 2100)),
        "n_mels": draw(st.integers(1, 160)),
        "fmin": fmin,
        "fmax": fmax,
        "htk": draw(st.booleans()),
        "norm": draw(st.sampled_from(NORMS)),
    }


@EXAMPLES
@given(filter_settings())
def test_mel_filters_equal_librosa_bitwise(chosen):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # both warn alike about empty filters
        ours = mel_filters(**chosen)
        rate = chosen.pop("sample_rate")
        theirs = librosa.filters.mel(sr=rate, **chosen)
    _identical(ours, theirs)


def test_mel_filters_returns_a_copy_the_caller_may_write():
    first = mel_filters(16_000, 400, 80)
    first[:] = 0
    assert mel_filters(16_000, 400, 80).any()


@st.composite
def spectrogram_settings(draw: st.DrawFn) -> tuple[np.ndarray, dict]:
    n_fft = draw(st.integers(8, 600))
    center = draw(st.booleans())
    length = draw(st.integers(1 if center else n_fft, 3000))  # shorter than n_fft too, odd too
    batch = draw(st.sampled_from([(), (2,), (2, 3)]))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    seed = draw(st.integers(0, 2**32 - 1))
    y = np.random.default_rng(seed).standard_normal((*batch, length)).astype(dtype)
    rate = draw(st.sampled_from(RATES))
    return y, {
        "sr": rate,
        "n_fft": n_fft,
        "hop_length": draw(st.integers(1, 2 * n_fft)),
        "win_length": draw(st.sampled_from([None, draw(st.integers(1, n_fft))])),
        "n_mels": draw(st.integers(1, 96)),
        "fmax": draw(st.sampled_from([None, rate / 3])),
        "power": draw(st.sampled_from([2.0, 1.0, 1.5])),
        "center": center,
        "pad_mode": draw(st.sampled_from(["constant", "reflect", "edge", "symmetric"])),
        "htk": draw(st.booleans()),
        "norm": draw(st.sampled_from(["slaney", None, 2.0])),
    }


@EXAMPLES
@given(spectrogram_settings())
def test_melspectrogram_equals_librosa_bitwise(drawn):
    y, chosen = drawn
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # librosa warns when n_fft exceeds the signal
        theirs = librosa.feature.melspectrogram(y=y, **chosen)
        ours = melspectrogram(y, **chosen)
    _identical(ours, theirs)


def test_melspectrogram_on_the_usual_settings_of_tts_models():
    y = np.random.default_rng(0).uniform(-1, 1, 22_050 * 2).astype(np.float32)
    chosen = {"sr": 22_050, "n_fft": 1024, "hop_length": 256, "n_mels": 80, "fmax": 8000.0}
    _identical(melspectrogram(y, **chosen), librosa.feature.melspectrogram(y=y, **chosen))


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: mel_filters(0, 400, 80), "sample_rate"),
        (lambda: mel_filters(16_000, 0, 80), "n_fft"),
        (lambda: mel_filters(16_000, 400, -1), "n_mels"),
        (lambda: mel_filters(16_000, 400, 80, fmax=9000.0), "fmax"),
        (lambda: mel_filters(16_000, 400, 80, fmin=-1.0), "fmin"),
        (lambda: mel_filters(16_000, 400, 80, fmin=3000.0, fmax=2000.0), "fmax"),
        (lambda: mel_filters(16_000, 400, 80, norm="l2"), "norm"),
        (lambda: melspectrogram(np.zeros((2, 0), np.float32), **_ARGS), "y"),
        (lambda: melspectrogram(np.zeros(800, np.int16), **_ARGS), "y"),
        (lambda: melspectrogram(np.full(800, np.nan, np.float32), **_ARGS), "y"),
        (
            lambda: melspectrogram(np.zeros(800, np.float32), **{**_ARGS, "win_length": 500}),
            "n_fft",
        ),
        (
            lambda: melspectrogram(np.zeros(800, np.float32), **{**_ARGS, "hop_length": 0}),
            "hop_length",
        ),
        (lambda: melspectrogram(np.zeros(800, np.float32), **{**_ARGS, "sr": -1}), "sr"),
        (
            lambda: melspectrogram(np.zeros(800, np.float32), **{**_ARGS, "pad_mode": "wrap"}),
            "pad_mode",
        ),
        (lambda: melspectrogram(np.zeros(100, np.float32), **{**_ARGS, "center": False}), "y"),
        (lambda: melspectrogram(np.zeros(800, np.float32), **{**_ARGS, "power": 0}), "power"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(call, argument):
    with pytest.raises(ValueError, match=rf"^{argument}: expected"):
        call()


_ARGS = {"sr": 16_000, "n_fft": 400, "hop_length": 160, "n_mels": 80}
