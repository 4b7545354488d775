"""Voices: a reference recording reduced to a short speaker embedding, stored in a folder.

The embedding is the classic cheap speaker feature: the mean of the recording's mel cepstrum
(coefficients 1..8, the spectral envelope; coefficient 0, the loudness, is left out), squashed
into [-1, 1]. It is computed with numpy alone at 16 kHz (the runtime's ``resample`` brings other
rates there), so a voice does not depend on the device or dtype the model runs in.
``prepare_voice`` writes it to ``voice.json``; ``synthesize`` reads a voice folder, or a PCM WAV
file directly (read with the standard library's ``wave``).

A recording is bounded before any work: 8 to 192 kHz, at most 10 minutes and 16 channels, and
only its first 30 s are read, so the time and memory a voice costs are bounded whatever the
caller sends. ``params["voice"]`` names a path that must lie inside an allowed folder (voices.py
decides which); the checks here see only files already allowed.
"""

from __future__ import annotations

import json
import math
import wave
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from mizuoto_runtime import resample
from mizuoto_sdk import InvalidRequest

EMBED_RATE = 16_000
DIMENSIONS = 8
VOICE_FILE = "voice.json"
FORMAT = "mizuoto-codeclm-voice"
MIN_SECONDS = 0.5
MAX_SECONDS = 30.0  # later audio is not read: the envelope's mean has settled long before
MAX_RECORDING_SECONDS = 600.0  # longer recordings are refused rather than silently cut
MIN_RATE, MAX_RATE = 8_000, 192_000
MAX_CHANNELS = 16
_WIDTHS = {1: "8", 2: "16", 3: "24", 4: "32"}  # PCM sample widths in bytes -> bits
_MAX_VOICE_FILE = 64 * 1024  # voice.json is a few hundred bytes
_FFT, _WINDOW, _HOP, _BANDS = 512, 400, 160, 40
_SCALE = 4.0  # cepstral coefficients of speech are mostly within +-8; tanh(c / 4) spreads them


def mono(samples: object) -> np.ndarray:
    """float32 [n] from a numpy array or torch tensor shaped [n] or [channels, n]."""
    if hasattr(samples, "detach"):
        samples = samples.detach().float().cpu().numpy()
    array = np.asarray(samples, dtype=np.float32)
    return array.mean(axis=0) if array.ndim == 2 else array.reshape(-1)


def check_recording(frames: int, rate: object, field: str) -> None:
    """InvalidRequest naming ``field`` unless ``rate`` and the length are within the bounds."""
    if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE:
        raise InvalidRequest(
            f"{field}: sample rate {rate!r} Hz; a voice recording needs {MIN_RATE} to "
            f"{MAX_RATE} Hz",
            {"field": field},
        )
    if frames / rate > MAX_RECORDING_SECONDS:
        raise InvalidRequest(
            f"{field}: {frames / rate:.0f} s of audio; a voice recording may be at most "
            f"{MAX_RECORDING_SECONDS:.0f} s (only the first {MAX_SECONDS:.0f} s are used)",
            {"field": field},
        )


def read_wav(path: Path, field: str) -> tuple[np.ndarray, int]:
    """The first 30 s of a PCM WAV file as float32 mono samples in [-1, 1], and its rate."""

    def unreadable(reason: object) -> InvalidRequest:
        return InvalidRequest(
            f"{field}: cannot read {path.name} as a PCM WAV file ({reason}); convert it to "
            "16-bit PCM",
            {"field": field},
        )

    try:
        with wave.open(str(path), "rb") as source:
            width, channels = source.getsampwidth(), source.getnchannels()
            rate, frames = source.getframerate(), source.getnframes()
            if width not in _WIDTHS:
                raise unreadable(f"{8 * width}-bit samples; expected 8, 16, 24 or 32-bit PCM")
            if not 1 <= channels <= MAX_CHANNELS:
                raise unreadable(f"{channels} channels; expected 1 to {MAX_CHANNELS}")
            check_recording(frames, rate, field)
            data = source.readframes(min(frames, math.ceil(MAX_SECONDS * rate)))
    except (wave.Error, EOFError, OSError) as error:
        raise unreadable(error) from None
    data = data[: len(data) - len(data) % (width * channels)]  # a truncated file: whole frames
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
    """The speaker embedding [8] in [-1, 1] of a mono recording at 8 to 192 kHz.

    Only the first 30 s are used; resampling checks the bound call's cancel as it goes.
    """
    check_recording(len(samples), sample_rate, field)
    seconds = len(samples) / sample_rate
    samples = samples[: math.ceil(MAX_SECONDS * sample_rate)]
    if not np.isfinite(samples).all():
        raise InvalidRequest(f"{field}: holds NaN or infinite samples", {"field": field})
    if seconds < MIN_SECONDS:
        raise InvalidRequest(
            f"{field}: {seconds:.2f} s of audio; a voice needs at least {MIN_SECONDS} s",
            {"field": field},
        )
    x = resample(samples, sample_rate, EMBED_RATE)
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


def write_voice(voice_dir: Path, embedding: np.ndarray, meta: Mapping[str, object]) -> list[str]:
    """Write ``voice.json`` into ``voice_dir``; returns the names written."""
    payload = {"format": FORMAT, "version": 1, "embedding": [float(v) for v in embedding], **meta}
    (voice_dir / VOICE_FILE).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return [VOICE_FILE]


def read_voice(path: Path, field: str = "params.voice") -> np.ndarray:
    """The embedding of an allowed ``path``: a folder written by prepare_voice, or a WAV file."""
    if path.is_dir():
        return _read_voice_file(path / VOICE_FILE, field)
    samples, rate = read_wav(path, field)
    return speaker_embedding(samples, rate, field)


def _read_voice_file(path: Path, field: str) -> np.ndarray:
    try:
        if path.resolve().parent != path.parent.resolve():  # a link out of the voice folder
            raise ValueError(path)
        with path.open("rb") as file:
            raw = file.read(_MAX_VOICE_FILE + 1)
        payload = json.loads(raw) if len(raw) <= _MAX_VOICE_FILE else None
        embedding = np.asarray(payload["embedding"], dtype=np.float32)  # type: ignore[index]
        valid = payload.get("format") == FORMAT and embedding.shape == (DIMENSIONS,)  # type: ignore[union-attr]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        valid = False
    if not valid or not np.isfinite(embedding).all():
        raise InvalidRequest(
            f"{field}: {path.parent.name}/{path.name} is not a codeclm voice; make one with "
            "prepare_voice",
            {"field": field},
        )
    return embedding
