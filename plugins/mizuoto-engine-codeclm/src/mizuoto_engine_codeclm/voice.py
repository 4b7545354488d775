"""Voices: a reference recording reduced to a short speaker embedding, stored in a folder.

The embedding is the classic cheap speaker feature: the mean of the recording's mel cepstrum
(coefficients 1..8, the spectral envelope; coefficient 0, the loudness, is left out), squashed
into [-1, 1]. It is computed with numpy alone at 16 kHz, so a voice does not depend on the device
or dtype the model runs in. ``prepare_voice`` writes it to ``voice.json``; ``synthesize`` reads a
voice folder, or a WAV file directly (read with the standard library's ``wave``).
"""

from __future__ import annotations

import json
import math
import os
import wave
from pathlib import Path

import numpy as np

from mizuoto_sdk import InvalidRequest

EMBED_RATE = 16_000
DIMENSIONS = 8
VOICE_FILE = "voice.json"
FORMAT = "mizuoto-codeclm-voice"
MIN_SECONDS = 0.5
MAX_SECONDS = 30.0  # later audio is not read: the envelope's mean has settled long before
_FFT, _WINDOW, _HOP, _BANDS = 512, 400, 160, 40
_BETA = 8.0  # the Kaiser window's shape: about 80 dB of stopband
_SCALE = 4.0  # cepstral coefficients of speech are mostly within +-8; tanh(c / 4) spreads them


def mono(samples: object) -> np.ndarray:
    """float32 [n] from a numpy array or torch tensor shaped [n] or [channels, n]."""
    if hasattr(samples, "detach"):
        samples = samples.detach().float().cpu().numpy()  # type: ignore[attr-defined]
    array = np.asarray(samples, dtype=np.float32)
    return array.mean(axis=0) if array.ndim == 2 else array.reshape(-1)


def read_wav(path: Path, field: str) -> tuple[np.ndarray, int]:
    """A PCM WAV file as float32 mono samples in [-1, 1] and its sample rate."""
    try:
        with wave.open(str(path), "rb") as source:
            width, channels = source.getsampwidth(), source.getnchannels()
            rate, data = source.getframerate(), source.readframes(source.getnframes())
    except (wave.Error, EOFError, OSError) as error:
        raise InvalidRequest(
            f"{field}: cannot read {path} as a PCM WAV file ({error}); convert it to 16-bit PCM",
            {"field": field},
        ) from None
    if width == 1:  # 8-bit WAV is unsigned
        pcm = (np.frombuffer(data, np.uint8).astype(np.float32) - 128) / 128
    elif width == 3:
        raw = np.frombuffer(data, np.uint8).reshape(-1, 3).astype(np.int32)
        signed = (raw[:, 0] | raw[:, 1] << 8 | raw[:, 2] << 16) << 8 >> 8
        pcm = signed.astype(np.float32) / 2**23
    else:
        kind = {2: "<i2", 4: "<i4"}[width]
        pcm = np.frombuffer(data, kind).astype(np.float32) / 2 ** (8 * width - 1)
    return pcm.reshape(-1, channels).mean(axis=1), rate


def resample(samples: np.ndarray, source_rate: int, target_rate: int) -> np.ndarray:
    """Band-limited resampling: a Kaiser-windowed sinc evaluated at each output instant.

    Output sample n sits at input time n * down / up (the rates' ratio in lowest terms), so its
    filter depends only on the phase (n * down) mod up; each block computes the filters of the
    phases it meets once.
    """
    if source_rate == target_rate:
        return samples.astype(np.float32)
    common = math.gcd(source_rate, target_rate)
    up, down = target_rate // common, source_rate // common
    cutoff = min(1.0, up / down)  # below both Nyquist frequencies
    half = math.ceil(16 / cutoff)  # taps on each side: 16 zero crossings of the filter
    count = len(samples) * up // down
    padded = np.pad(samples.astype(np.float64), (half, half + 1))
    taps = np.arange(-half + 1, half + 1)
    out = np.empty(count, np.float64)
    for start in range(0, count, 8192):  # blocks keep the [outputs, taps] matrix small
        position = np.arange(start, min(start + 8192, count), dtype=np.int64) * down
        base, phase = position // up, position % up
        phases, which = np.unique(phase, return_inverse=True)
        offset = taps[None, :] - phases[:, None] / up  # [phases, taps]: input minus output time
        window = np.i0(_BETA * np.sqrt(np.clip(1 - (offset / half) ** 2, 0, None))) / np.i0(_BETA)
        bank = cutoff * np.sinc(cutoff * offset) * window
        gathered = padded[base[:, None] + taps + half]  # [block, taps]
        out[start : start + len(base)] = np.einsum("bt,bt->b", gathered, bank[which])
    return out.astype(np.float32)


def _mel_filters() -> np.ndarray:
    """[bands, fft bins] triangular filters between 60 Hz and 7.6 kHz on the mel scale."""

    def mel(hz: np.ndarray) -> np.ndarray:
        return 2595 * np.log10(1 + hz / 700)

    points = np.linspace(mel(np.array(60.0)), mel(np.array(7600.0)), _BANDS + 2)
    edges = 700 * (10 ** (points / 2595) - 1)
    bins = np.fft.rfftfreq(_FFT, 1 / EMBED_RATE)
    low, mid, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising, falling = (bins - low) / (mid - low), (high - bins) / (high - mid)
    return np.clip(np.minimum(rising, falling), 0, None)


def speaker_embedding(samples: np.ndarray, sample_rate: int, field: str = "audio") -> np.ndarray:
    """The speaker embedding [8] in [-1, 1] of a mono recording at any sample rate."""
    seconds = len(samples) / sample_rate
    if not np.isfinite(samples).all():
        raise InvalidRequest(f"{field}: holds NaN or infinite samples", {"field": field})
    if seconds < MIN_SECONDS:
        raise InvalidRequest(
            f"{field}: {seconds:.2f} s of audio; a voice needs at least {MIN_SECONDS} s",
            {"field": field},
        )
    x = resample(samples[: math.ceil(MAX_SECONDS * sample_rate)], sample_rate, EMBED_RATE)
    x = x.astype(np.float64) - x.mean()
    if np.sqrt(np.mean(x**2)) < 1e-4:
        raise InvalidRequest(f"{field}: is silent; record someone speaking", {"field": field})
    count = 1 + (len(x) - _WINDOW) // _HOP
    frames = np.lib.stride_tricks.sliding_window_view(x, _WINDOW)[::_HOP][:count]
    power = np.abs(np.fft.rfft(frames * np.hanning(_WINDOW), _FFT)) ** 2  # [frames, bins]
    log_mel = np.log(power @ _mel_filters().T + 1e-10)  # [frames, bands]
    n = np.arange(_BANDS)
    dct = np.cos(np.pi / _BANDS * (n[None, :] + 0.5) * n[:, None]) * np.sqrt(2 / _BANDS)
    cepstrum = (log_mel @ dct.T).mean(axis=0)  # [bands], orthonormal DCT-II of the mean
    return np.tanh(cepstrum[1 : DIMENSIONS + 1] / _SCALE).astype(np.float32)


def write_voice(voice_dir: Path, embedding: np.ndarray, meta: dict[str, object]) -> list[str]:
    """Write ``voice.json`` into ``voice_dir``; returns the names written."""
    payload = {"format": FORMAT, "version": 1, "embedding": [float(v) for v in embedding], **meta}
    (voice_dir / VOICE_FILE).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return [VOICE_FILE]


def load_voice(value: object, field: str = "params.voice") -> np.ndarray:
    """The embedding of ``value``: a folder written by prepare_voice, or a ``.wav`` file."""
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise InvalidRequest(
            f"{field}: expected the path of a prepared voice folder or a .wav file, got {value!r}",
            {"field": field},
        )
    path = Path(value)
    if path.is_dir():
        return _read_voice_file(path / VOICE_FILE, field)
    if path.is_file() and path.suffix.lower() == ".wav":
        samples, rate = read_wav(path, field)
        return speaker_embedding(samples, rate, field)
    raise InvalidRequest(
        f"{field}: {path} is neither a voice folder (made by prepare_voice) nor a .wav file",
        {"field": field},
    )


def _read_voice_file(path: Path, field: str) -> np.ndarray:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        embedding = np.asarray(payload["embedding"], dtype=np.float32)
        valid = payload.get("format") == FORMAT and embedding.shape == (DIMENSIONS,)
    except (OSError, ValueError, KeyError, TypeError):
        valid = False
    if not valid or not np.isfinite(embedding).all():
        raise InvalidRequest(
            f"{field}: {path} is not a codeclm voice; make one with prepare_voice",
            {"field": field},
        )
    return embedding
