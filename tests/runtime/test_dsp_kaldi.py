"""kaldi_fbank: torchaudio's Kaldi fbank algorithm, compared with kaldi-native-fbank run here.

Both compute in float32 with different arithmetic, so where a band holds a few millionths of the
frame's energy (the lowest bands after pre-emphasis) each is about 1e-3 from a float64
computation; elsewhere they agree within 1e-3.
"""

from __future__ import annotations

import kaldi_native_fbank as knf
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.dsp import kaldi_fbank

WINDOWS = ("povey", "hanning", "hamming", "rectangular", "blackman")


def _theirs(samples: np.ndarray, options: dict) -> np.ndarray:
    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0.0  # knf's default is not 0
    opts.frame_opts.samp_freq = options.get("sample_frequency", 16000.0)
    opts.frame_opts.frame_length_ms = options.get("frame_length", 25.0)
    opts.frame_opts.frame_shift_ms = options.get("frame_shift", 10.0)
    opts.frame_opts.snip_edges = options.get("snip_edges", True)
    opts.frame_opts.window_type = options.get("window_type", "povey")
    opts.frame_opts.remove_dc_offset = options.get("remove_dc_offset", True)
    opts.frame_opts.preemph_coeff = options.get("preemphasis_coefficient", 0.97)
    opts.mel_opts.num_bins = options.get("num_mel_bins", 80)
    opts.mel_opts.low_freq = options.get("low_freq", 20.0)
    opts.mel_opts.high_freq = options.get("high_freq", 0.0)
    opts.use_energy = options.get("use_energy", False)
    opts.raw_energy = options.get("raw_energy", True)
    opts.htk_compat = options.get("htk_compat", False)
    opts.use_power = options.get("use_power", True)
    fbank = knf.OnlineFbank(opts)
    fbank.accept_waveform(opts.frame_opts.samp_freq, samples.tolist())
    fbank.input_finished()
    return np.stack([fbank.get_frame(i) for i in range(fbank.num_frames_ready)])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(
    length=st.integers(400, 20_000),
    options=st.fixed_dictionaries(
        {
            "num_mel_bins": st.sampled_from([23, 40, 80]),
            "snip_edges": st.booleans(),
            "window_type": st.sampled_from(WINDOWS),
            "use_energy": st.booleans(),
            "raw_energy": st.booleans(),
            "htk_compat": st.booleans(),
            "remove_dc_offset": st.booleans(),
            "preemphasis_coefficient": st.sampled_from([0.97, 0.0]),
            "low_freq": st.sampled_from([20.0, 0.0, 300.0]),
            "high_freq": st.sampled_from([0.0, -400.0, 7600.0]),
            "use_power": st.booleans(),
        }
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_agrees_with_kaldi_native_fbank(length, options, seed):
    samples = np.random.default_rng(seed).uniform(-1, 1, length).astype(np.float32)
    ours = kaldi_fbank(torch.from_numpy(samples)[None], **options).numpy()
    theirs = _theirs(samples, options)
    assert ours.shape == theirs.shape
    wide = kaldi_fbank(torch.from_numpy(samples).double(), **options).numpy()
    assert np.abs(ours - wide).max() < 5e-3 and np.abs(theirs - wide).max() < 5e-3
    held = wide > -9.0  # bands holding more than e^-9 of energy
    assert np.abs(ours - theirs)[held].max(initial=0.0) < 1e-3


@pytest.mark.parametrize("rate", [8000.0, 16000.0, 22050.0])
def test_other_rates_and_frames_agree(rate):
    samples = np.random.default_rng(3).uniform(-1, 1, int(rate)).astype(np.float32)
    options = {"sample_frequency": rate, "frame_length": 32.0, "frame_shift": 12.5}
    ours = kaldi_fbank(torch.from_numpy(samples), **options).numpy()
    theirs = _theirs(samples, options)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, atol=1e-3, rtol=0)


def test_cosyvoice_s_call_on_a_two_dimensional_waveform():
    speech = torch.from_numpy(
        np.random.default_rng(4).uniform(-0.5, 0.5, (1, 24_000)).astype(np.float32)
    )
    ours = kaldi_fbank(speech, num_mel_bins=80, dither=0, sample_frequency=16000)
    assert ours.shape == (148, 80) and ours.dtype == torch.float32
    np.testing.assert_allclose(ours.numpy(), _theirs(speech[0].numpy(), {}), atol=1e-3, rtol=0)


def test_mean_subtraction_and_linear_output():
    x = torch.from_numpy(np.random.default_rng(5).uniform(-1, 1, 8_000).astype(np.float32))
    linear = kaldi_fbank(x, use_log_fbank=False)
    torch.testing.assert_close(
        kaldi_fbank(x), torch.clamp(linear, min=torch.finfo(torch.float32).eps).log()
    )
    centred = kaldi_fbank(x, subtract_mean=True)
    torch.testing.assert_close(centred, kaldi_fbank(x) - kaldi_fbank(x).mean(dim=0))


def test_dither_draws_from_the_request_generator_never_the_global_one():
    x = torch.zeros(4_000)
    before = torch.random.get_rng_state()
    with RequestContext(seed=7).bind():
        first = kaldi_fbank(x, dither=1.0)
    with RequestContext(seed=7).bind():
        again = kaldi_fbank(x, dither=1.0)
    with RequestContext(seed=8).bind():
        other = kaldi_fbank(x, dither=1.0)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(first, again) and not torch.equal(first, other)
    explicit = kaldi_fbank(x, dither=1.0, generator=torch.Generator().manual_seed(7))
    assert torch.equal(explicit, first)  # the context's generator is seeded with its seed
    with pytest.raises(ValueError, match=r"^generator: "):
        kaldi_fbank(x, dither=1.0)  # no context, no generator: never the global RNG


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"waveform": torch.zeros(2, 2, 4_000)}, "waveform"),
        ({"waveform": torch.zeros(100)}, "waveform"),
        ({"waveform": torch.zeros(1, 4_000), "channel": 1}, "channel"),
        ({"sample_frequency": 0}, "sample_frequency"),
        ({"frame_shift": -10.0}, "frame_shift"),
        ({"num_mel_bins": 3}, "num_mel_bins"),
        ({"window_type": "hann"}, "window_type"),
        ({"high_freq": 9000.0}, "high_freq"),
        ({"low_freq": 8000.0}, "low_freq"),
        ({"preemphasis_coefficient": 1.5}, "preemphasis_coefficient"),
        ({"vtln_warp": 0.9}, "vtln_warp"),
        ({"dither": -1.0}, "dither"),
        ({"frame_length": 25.0625, "round_to_power_of_two": False}, "frame_length"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(options, argument):
    arguments = {"waveform": torch.zeros(4_000), **options}
    with pytest.raises(ValueError, match=rf"^{argument}: "):
        kaldi_fbank(**arguments)


@pytest.mark.cuda
def test_on_cuda_agrees_with_kaldi_native_fbank_on_the_cpu():
    samples = np.random.default_rng(6).uniform(-1, 1, 48_000).astype(np.float32)
    on_gpu = kaldi_fbank(torch.from_numpy(samples).cuda(), use_energy=True)
    assert on_gpu.device.type == "cuda"
    theirs = _theirs(samples, {"use_energy": True})
    np.testing.assert_allclose(on_gpu.cpu().numpy(), theirs, atol=2e-3, rtol=0)
    generator = torch.Generator("cuda").manual_seed(0)
    dithered = kaldi_fbank(torch.from_numpy(samples).cuda(), dither=1e-4, generator=generator)
    assert dithered.isfinite().all()
