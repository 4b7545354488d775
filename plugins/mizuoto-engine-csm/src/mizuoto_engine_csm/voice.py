"""Voices: what CSM conditions on, kept in a folder as ``voice.json``.

CSM clones a voice from context: a turn whose text is the recording's transcript and whose audio
is the recording, spoken by a speaker id, placed before the turn to speak. Upstream's processor
Mimi-encodes the context audio on every call; ``prepare_voice`` encodes it once (the codes equal
upstream's encode, bit for bit) and stores the codes with the transcript and speaker, so a
synthesis with the voice renders the same prompt ``apply_chat_template`` makes from the same
conversation. Codes are small (12.5 frames per second), so the file is plain JSON.

A recording is bounded before any work: 8 to 192 kHz, at most 10 minutes; only its first 30 s
are encoded (a longer context leaves less room for the speech). It is resampled to the codec's
rate by the runtime's ``resample`` when it has another.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import numpy as np

from mizuoto_engine_csm.params import MAX_SPEAKER, MAX_TRANSCRIPT_CHARS
from mizuoto_sdk import InvalidRequest

VOICE_FILE = "voice.json"
FORMAT = "mizuoto-csm-voice"
MIN_SECONDS = 0.5
MAX_SECONDS = 30.0
MAX_RECORDING_SECONDS = 600.0
MIN_RATE, MAX_RATE = 8_000, 192_000
_MAX_VOICE_FILE = 4 * 1024 * 1024


@attrs.frozen
class Voice:
    """A context turn: ``codes`` [K][frames] of the recording, its transcript, its speaker."""

    speaker: int
    transcript: str
    codes: tuple[tuple[int, ...], ...]

    @property
    def frames(self) -> int:
        return len(self.codes[0])


def mono(samples: object) -> np.ndarray:
    """float32 [n] from a numpy array or torch tensor shaped [n] or [channels, n]."""
    if hasattr(samples, "detach"):
        samples = samples.detach().float().cpu().numpy()
    array = np.asarray(samples, dtype=np.float32)
    return array.mean(axis=0) if array.ndim == 2 else array.reshape(-1)


def check_recording(samples: np.ndarray, rate: object, field: str = "audio") -> np.ndarray:
    """The first 30 s of ``samples``; InvalidRequest naming ``field`` when out of bounds."""
    if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE:
        raise InvalidRequest(
            f"{field}: sample rate {rate!r} Hz; a voice recording needs {MIN_RATE} to "
            f"{MAX_RATE} Hz",
            {"field": field},
        )
    seconds = samples.size / rate
    if seconds > MAX_RECORDING_SECONDS:
        raise InvalidRequest(
            f"{field}: {seconds:.0f} s of audio; at most {MAX_RECORDING_SECONDS:.0f} s "
            f"(only the first {MAX_SECONDS:.0f} s are used)",
            {"field": field},
        )
    if seconds < MIN_SECONDS:
        raise InvalidRequest(
            f"{field}: {seconds:.2f} s of audio; a voice needs at least {MIN_SECONDS} s",
            {"field": field},
        )
    samples = samples[: math.ceil(MAX_SECONDS * rate)]
    if not np.isfinite(samples).all():
        raise InvalidRequest(f"{field}: holds NaN or infinite samples", {"field": field})
    return samples


def check_transcript(value: object, field: str = "params.transcript") -> str:
    """The transcript, or "" when none is given (the context turn then has no words: upstream
    renders ``[speaker]`` alone; cloning works better with the words, and the caller is told)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidRequest(f"{field}: expected text, got {value!r}", {"field": field})
    if len(value) > MAX_TRANSCRIPT_CHARS:
        raise InvalidRequest(
            f"{field}: {len(value)} characters; at most {MAX_TRANSCRIPT_CHARS}", {"field": field}
        )
    return value


def write_voice(voice_dir: Path, voice: Voice, meta: Mapping[str, object]) -> list[str]:
    """Write ``voice.json`` into ``voice_dir``; returns the names written."""
    payload = {
        "format": FORMAT,
        "version": 1,
        "speaker": voice.speaker,
        "transcript": voice.transcript,
        "codes": [list(row) for row in voice.codes],
        **meta,
    }
    (voice_dir / VOICE_FILE).write_text(json.dumps(payload) + "\n", encoding="utf-8")
    return [VOICE_FILE]


def read_voice(
    path: Path, codebooks: int, codebook_size: int, field: str = "params.voice"
) -> Voice:
    """The voice in an allowed folder ``path``, checked against this model's codec."""
    file = path / VOICE_FILE
    voice = None
    try:
        if file.resolve().parent != path.resolve():  # a link out of the voice folder
            raise ValueError(file)
        with file.open("rb") as source:
            raw = source.read(_MAX_VOICE_FILE + 1)
        if len(raw) <= _MAX_VOICE_FILE:
            voice = _parse(json.loads(raw), codebooks, codebook_size)
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        voice = None
    if voice is None:
        raise InvalidRequest(
            f"{field}: {path.name} is not a csm voice for this model ({codebooks} codebooks of "
            f"{codebook_size} codes); make one with prepare_voice",
            {"field": field},
        )
    return voice


def _parse(payload: object, codebooks: int, codebook_size: int) -> Voice | None:
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        return None
    speaker, transcript, codes = payload["speaker"], payload["transcript"], payload["codes"]
    if isinstance(speaker, bool) or not isinstance(speaker, int):
        return None
    if not 0 <= speaker <= MAX_SPEAKER or not isinstance(transcript, str):
        return None
    if not isinstance(codes, list) or len(codes) != codebooks:
        return None
    rows: list[tuple[int, ...]] = []
    for row in codes:
        if not isinstance(row, list) or not row or len(row) != len(codes[0]):
            return None
        if not all(isinstance(c, int) and not isinstance(c, bool) for c in row):
            return None
        if min(row) < 0 or max(row) >= codebook_size:
            return None
        rows.append(tuple(row))
    return Voice(speaker, transcript, tuple(rows))


def codes_of(array: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(c) for c in row) for row in array)
