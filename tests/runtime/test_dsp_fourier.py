"""stft / istft: torch.stft / torch.istft themselves, with a Hann window by default."""

from __future__ import annotations

import pytest
import torch

from mizuoto_runtime.dsp import istft, stft

CASES = [
    {"n_fft": 512},
    {"n_fft": 400, "hop_length": 100, "win_length": 300},
    {"n_fft": 64, "hop_length": 8, "normalized": True},
    {"n_fft": 1024, "hop_length": 256, "center": False},
]


def _window(case: dict, dtype: torch.dtype) -> torch.Tensor:
    return torch.hann_window(case.get("win_length", case["n_fft"]), dtype=dtype)


def _theirs(x: torch.Tensor, case: dict) -> torch.Tensor:
    rest = {k: v for k, v in case.items() if k not in ("n_fft", "hop_length", "win_length")}
    return torch.stft(
        x,
        case["n_fft"],
        case.get("hop_length"),
        case.get("win_length"),
        _window(case, x.dtype),
        return_complex=True,
        **rest,
    )


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_stft_and_istft_equal_torch_with_a_hann_window(case, dtype):
    x = torch.randn(3, 5_001, generator=torch.Generator().manual_seed(0), dtype=dtype)
    theirs = _theirs(x, case)
    ours = stft(x, **case)
    assert torch.equal(ours, theirs)
    assert torch.equal(stft(x[1], **case), _theirs(x[1], case))
    if not case.get("center", True):
        return  # torch's istft needs the centred frames' overlap to reach the ends
    back = torch.istft(
        theirs,
        case["n_fft"],
        case.get("hop_length"),
        case.get("win_length"),
        _window(case, dtype),
        normalized=case.get("normalized", False),
        length=5_001,
    )
    assert torch.equal(istft(ours, **case, length=5_001), back)
    torch.testing.assert_close(back, x)


def test_leading_dimensions_flatten_into_torch_s_batch():
    x = torch.randn(2, 3, 2_000, generator=torch.Generator().manual_seed(1))
    ours = stft(x, 256)
    assert torch.equal(ours, _theirs(x.reshape(6, 2_000), {"n_fft": 256}).reshape(2, 3, 129, -1))
    assert torch.equal(istft(ours, 256), istft(ours.reshape(6, 129, -1), 256).reshape(2, 3, -1))


def test_an_explicit_window_is_used_as_given():
    x = torch.randn(4_000, generator=torch.Generator().manual_seed(2))
    window = torch.ones(256)
    theirs = torch.stft(x, 256, window=window, return_complex=True)
    assert torch.equal(stft(x, 256, window=window), theirs)


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: stft(torch.zeros(1_000), 0), "n_fft"),
        (lambda: stft(torch.zeros(1_000), 256, win_length=512), "n_fft"),
        (lambda: stft(torch.zeros(1_000), 256, hop_length=-1), "hop_length"),
        (lambda: stft(torch.zeros(()), 256), "input"),
        (lambda: istft(torch.zeros(129, 10), 256), "input"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(call, argument):
    with pytest.raises(ValueError, match=rf"^{argument}: expected"):
        call()
