"""Kaldi's filter-bank features as ``torchaudio.compliance.kaldi.fbank`` computes them.

The algorithm, options and defaults are torchaudio's (2.x), which reproduces Kaldi's
``compute-fbank-feats``: frames of ``frame_length`` ms every ``frame_shift`` ms (with
``snip_edges`` only whole frames, else ``round(T / shift)`` frames reflected at both ends),
optional dither, per-frame mean removal, the raw log energy, pre-emphasis (the first sample
against itself), a Povey window (Hann to the power 0.85; or hanning, hamming, rectangular,
blackman), zero padding to a power of two, ``|rfft|²``, triangular filters on Kaldi's mel scale
``1127 ln(1 + f / 700)`` between ``low_freq`` and ``high_freq`` (built in float32 as torchaudio
builds them), and the log floored at float32's epsilon. Every step is the torch operation
torchaudio runs, so on one device and dtype the result should be torchaudio's to the bit;
torchaudio cannot be installed beside this torch, so the test compares with kaldi-native-fbank
instead (see below).

Left out: VTLN warping (``vtln_warp`` must be 1.0) and ``min_duration``. Dither draws from the
bound request's generator (``ctx.generator_for(device)``) or ``generator=``, never from torch's
global one (torchaudio's ``torch.randn``), so seeded calls repeat and engines stay independent.

kaldi-native-fbank (the C++ port sherpa and FunASR use) computes the same features in float32
with other arithmetic: its window in float64, sums and the FFT in its own order, the mel weights
from float32 ``logf``. Log filter-bank values agree within about 1e-4 wherever the band energy is
well above epsilon; its default dither is not 0, so pass ``dither=0`` there to compare.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from mizuoto_runtime.context import current_context
from mizuoto_runtime.dsp import _checks
from mizuoto_runtime.dsp.fourier import as_tensor

WINDOW_TYPES = ("povey", "hanning", "hamming", "rectangular", "blackman")
_EPSILON = torch.finfo(torch.float32).eps  # Kaldi's floor, whatever the dtype


def kaldi_fbank(
    waveform: torch.Tensor,
    *,
    sample_frequency: float = 16000.0,
    num_mel_bins: int = 80,
    frame_length: float = 25.0,
    frame_shift: float = 10.0,
    dither: float = 0.0,
    preemphasis_coefficient: float = 0.97,
    remove_dc_offset: bool = True,
    window_type: str = "povey",
    blackman_coeff: float = 0.42,
    round_to_power_of_two: bool = True,
    snip_edges: bool = True,
    low_freq: float = 20.0,
    high_freq: float = 0.0,
    energy_floor: float = 1.0,
    raw_energy: bool = True,
    use_energy: bool = False,
    htk_compat: bool = False,
    use_log_fbank: bool = True,
    use_power: bool = True,
    subtract_mean: bool = False,
    vtln_warp: float = 1.0,
    channel: int = -1,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """[frames, num_mel_bins (+ 1 with use_energy)] features of ``waveform`` [T] or [channels, T].

    Options and defaults are torchaudio's, except ``num_mel_bins`` (80 here, as CosyVoice's
    speaker encoder and CAM++ use it; torchaudio's default is 23). ``channel`` picks the row of
    a [channels, T] waveform (-1 is 0, as in torchaudio).
    """
    waveform = as_tensor("waveform", waveform)
    if waveform.ndim == 2:
        row = max(channel, 0)
        if not row < waveform.shape[0]:
            raise ValueError(
                f"channel: expected < {waveform.shape[0]} (the waveform's rows), got {channel}"
            )
        waveform = waveform[row]
    elif waveform.ndim != 1:
        raise ValueError(
            f"waveform: expected [T] or [channels, T], got shape {tuple(waveform.shape)}"
        )
    rate = _checks.positive_number("sample_frequency", sample_frequency)
    num_mel_bins = _checks.positive_int("num_mel_bins", num_mel_bins)
    shift = int(rate * _checks.positive_number("frame_shift", frame_shift) * 0.001)
    size = int(rate * _checks.positive_number("frame_length", frame_length) * 0.001)
    padded = 1 if size == 0 else 2 ** (size - 1).bit_length() if round_to_power_of_two else size
    if shift < 1:
        raise ValueError(f"frame_shift: expected at least one sample, got {frame_shift} ms")
    if not 2 <= size <= len(waveform):
        raise ValueError(
            f"waveform: expected at least frame_length's {size} samples (and frame_length at "
            f"least 2 samples), got {len(waveform)}"
        )
    if padded % 2:
        raise ValueError(
            f"frame_length: expected an even number of samples ({size}) or round_to_power_of_two"
        )
    if not 0.0 <= preemphasis_coefficient <= 1.0:
        raise ValueError(
            f"preemphasis_coefficient: expected a number in [0, 1], got {preemphasis_coefficient}"
        )
    if window_type not in WINDOW_TYPES:
        raise ValueError(
            f"window_type: expected one of {', '.join(WINDOW_TYPES)}, got {window_type!r}"
        )
    if num_mel_bins <= 3:
        raise ValueError(f"num_mel_bins: expected more than 3, got {num_mel_bins}")
    nyquist = 0.5 * rate
    high = high_freq + nyquist if high_freq <= 0.0 else high_freq
    if not 0.0 <= low_freq < nyquist:
        raise ValueError(f"low_freq: expected a frequency in [0, {nyquist:g}) Hz, got {low_freq}")
    if not low_freq < high <= nyquist:
        raise ValueError(
            f"high_freq: expected a frequency in ({low_freq:g}, {nyquist:g}] Hz "
            "(or <= 0: that far below Nyquist), "
            f"got {high_freq}"
        )
    if vtln_warp != 1.0:
        raise ValueError(
            f"vtln_warp: VTLN warping is not implemented, expected 1.0, got {vtln_warp}"
        )
    if dither < 0:
        raise ValueError(f"dither: expected a number >= 0, got {dither}")
    device, dtype = waveform.device, waveform.dtype
    epsilon = torch.tensor(_EPSILON, device=device, dtype=dtype)

    frames = _frames(waveform, size, shift, snip_edges)  # [m, size]
    if dither != 0.0:
        noise = torch.randn(
            frames.shape, generator=_generator(generator, device), device=device, dtype=dtype
        )
        frames = frames + noise * dither
    if remove_dc_offset:
        frames = frames - torch.mean(frames, dim=1).unsqueeze(1)
    if raw_energy:
        log_energy = _log_energy(frames, epsilon, energy_floor)
    if preemphasis_coefficient != 0.0:
        previous = F.pad(frames.unsqueeze(0), (1, 0), mode="replicate").squeeze(0)[:, :-1]
        frames = frames - preemphasis_coefficient * previous
    frames = frames * _window(window_type, size, blackman_coeff, device, dtype).unsqueeze(0)
    if not raw_energy:  # the energy of the zero-padded frame, summed as torchaudio sums it
        frames = F.pad(frames.unsqueeze(0), (0, padded - size), mode="constant", value=0).squeeze(0)
        log_energy = _log_energy(frames, epsilon, energy_floor)

    # rfft's own zero padding to n gives the bits of padding first, without the copy
    spectrum = torch.fft.rfft(frames, n=padded).abs()  # [m, padded // 2 + 1]
    if use_power:
        spectrum = spectrum.pow(2.0)
    energies = torch.mm(
        spectrum, _banks(num_mel_bins, padded, rate, float(low_freq), high, device, dtype).T
    )
    if use_log_fbank:
        energies = torch.max(energies, epsilon).log()
    if use_energy:
        pair = (
            (energies, log_energy.unsqueeze(1))
            if htk_compat
            else (log_energy.unsqueeze(1), energies)
        )
        energies = torch.cat(pair, dim=1)
    if subtract_mean:
        energies = energies - torch.mean(energies, dim=0).unsqueeze(0)
    return energies


def _frames(waveform: torch.Tensor, size: int, shift: int, snip_edges: bool) -> torch.Tensor:
    """[m, size] overlapping frames; without snip_edges the ends are mirrored (sample 0 twice)."""
    count = len(waveform)
    if snip_edges:
        m = 1 + (count - size) // shift
    else:
        reversed_ = torch.flip(waveform, [0])
        m = (count + shift // 2) // shift
        pad = size // 2 - shift // 2
        if pad > 0:
            waveform = torch.cat((reversed_[-pad:], waveform, reversed_), dim=0)
        else:
            waveform = torch.cat((waveform[-pad:], reversed_), dim=0)
    step = waveform.stride(0)
    return waveform.as_strided((m, size), (shift * step, step))


def _log_energy(frames: torch.Tensor, epsilon: torch.Tensor, energy_floor: float) -> torch.Tensor:
    log_energy = torch.max(frames.pow(2).sum(1), epsilon).log()
    if energy_floor == 0.0:
        return log_energy
    floor = torch.tensor(math.log(energy_floor), device=frames.device, dtype=frames.dtype)
    return torch.max(log_energy, floor)


@functools.lru_cache(maxsize=32)
def _window(
    window_type: str, size: int, blackman_coeff: float, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    with torch.inference_mode(False), torch.no_grad():
        if window_type in ("povey", "hanning"):
            window = torch.hann_window(size, periodic=False, device=device, dtype=dtype)
            return window.pow(0.85) if window_type == "povey" else window
        if window_type == "hamming":
            return torch.hamming_window(
                size, periodic=False, alpha=0.54, beta=0.46, device=device, dtype=dtype
            )
        if window_type == "rectangular":
            return torch.ones(size, device=device, dtype=dtype)
        a = 2 * math.pi / (size - 1)
        n = torch.arange(size, device=device, dtype=dtype)
        blackman = (
            blackman_coeff - 0.5 * torch.cos(a * n) + (0.5 - blackman_coeff) * torch.cos(2 * a * n)
        )
        return blackman.to(device=device, dtype=dtype)


@functools.lru_cache(maxsize=32)
def _banks(
    num_bins: int,
    padded: int,
    rate: float,
    low_freq: float,
    high_freq: float,
    device: torch.device,
    dtype: torch.dtype,
) -> torch.Tensor:
    """[num_bins, padded // 2 + 1] triangles on Kaldi's mel scale, built in float32 on the CPU;
    the Nyquist bin's column is zero."""
    with torch.inference_mode(False), torch.no_grad():
        mel_low, mel_high = (1127.0 * math.log(1.0 + f / 700.0) for f in (low_freq, high_freq))
        delta = (mel_high - mel_low) / (num_bins + 1)
        # float32 whatever torch's default dtype is (torchaudio's arange follows the default)
        index = torch.arange(num_bins, dtype=torch.float32).unsqueeze(1)
        left = mel_low + index * delta
        centre = mel_low + (index + 1.0) * delta
        right = mel_low + (index + 2.0) * delta
        fft_mel = (
            1127.0
            * (1.0 + (rate / padded) * torch.arange(padded // 2, dtype=torch.float32) / 700.0).log()
        )
        fft_mel = fft_mel.unsqueeze(0)
        rising = (fft_mel - left) / (centre - left)
        falling = (right - fft_mel) / (right - centre)
        banks = torch.max(torch.zeros(1, dtype=torch.float32), torch.min(rising, falling))
        banks = banks.to(device=device, dtype=dtype)
        return F.pad(banks, (0, 1), mode="constant", value=0)


def _generator(generator: torch.Generator | None, device: torch.device) -> torch.Generator:
    if generator is not None:
        return generator
    ctx = current_context()
    if ctx is None:
        raise ValueError(
            "generator: dither > 0 draws noise, and outside an engine call there is no request "
            "generator; pass generator=torch.Generator(...) or dither=0"
        )
    return ctx.generator_for(device)
