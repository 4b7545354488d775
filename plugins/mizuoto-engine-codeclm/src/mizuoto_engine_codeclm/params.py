"""The synthesize params this engine reads, checked in one place before any work is done.

Each bad value is an InvalidRequest naming ``params.<name>``, with the range it must be in. Keys
this engine does not read are left alone: the host and its clients put their own there (``seed``
is the host's). ``voice`` is only type-checked here; voice.py resolves the path.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping

import attrs

from mizuoto_sdk import InvalidRequest

MAX_CHUNK_FRAMES = 4096


def _invalid(field: str, expected: str, value: object) -> InvalidRequest:
    return InvalidRequest(f"{field}: expected {expected}, got {value!r}", {"field": field})


def _real(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _invalid(field, "a number", value)
    return float(value)


def _positive(field: str, value: object) -> float:
    number = _real(field, value)
    if not math.isfinite(number) or number <= 0:
        raise _invalid(field, "a finite number > 0", value)
    return number


def _fraction(field: str, value: object) -> float:
    number = _real(field, value)
    if not 0 < number <= 1:
        raise _invalid(field, "a number in (0, 1]", value)
    return number


def _count(low: int, high: int | None = None) -> Callable[[str, object], int]:
    expected = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"

    def check(field: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise _invalid(field, expected, value)
        if value < low or (high is not None and value > high):
            raise _invalid(field, expected, value)
        return int(value)

    return check


def _path(field: str, value: object) -> str:
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise _invalid(
            field, "the path of a voice folder (from prepare_voice) or a .wav file", value
        )
    return os.fspath(value)  # type: ignore[return-value]


_CHECKS: Mapping[str, Callable[[str, object], object]] = {
    "temperature": _positive,
    "top_k": _count(0),
    "top_p": _fraction,
    "repetition_penalty": _positive,
    "max_frames": _count(1),
    "chunk_frames": _count(1, MAX_CHUNK_FRAMES),
    "voice": _path,
}


@attrs.frozen(kw_only=True)
class SynthesisParams:
    """One request's settings, each already checked.

    ``temperature``, ``top_k`` (0: off), ``top_p`` (1: off) and ``repetition_penalty`` (1: off)
    shape the sampling of each code frame; ``max_frames`` bounds the length (default: from the
    text's length); ``chunk_frames`` is how many frames each streamed chunk holds; ``voice`` is a
    voice folder or a WAV file (None: the model's own voice).
    """

    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 0.95
    repetition_penalty: float = 1.05
    max_frames: int | None = None
    chunk_frames: int = 16
    voice: str | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, object]) -> SynthesisParams:
        """Read the keys this engine knows from ``params``; None means the default."""
        if not isinstance(params, Mapping):
            raise _invalid("params", "a mapping", params)
        values = {
            name: check(f"params.{name}", params[name])
            for name, check in _CHECKS.items()
            if params.get(name) is not None
        }
        return cls(**values)  # type: ignore[arg-type]
