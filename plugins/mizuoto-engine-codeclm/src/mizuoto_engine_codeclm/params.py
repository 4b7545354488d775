"""The synthesize params this engine reads: declared once, here, for the manifest (plugin.py).

The host checks each request against ``PARAMS`` before the engine runs, so every bad value is an
InvalidRequest naming ``params.<name>``, and hands on the checked values. ``voice`` is only typed
here; voice.py resolves the path. Torch-free: plugin.py imports this module to list the engine.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from mizuoto_sdk import InvalidRequest, Param

MAX_CHUNK_FRAMES = 4096

PARAMS: tuple[Param, ...] = (
    Param(
        "temperature",
        "float",
        0.9,
        minimum=0,
        exclusive_minimum=True,
        help="sampling temperature of each code frame",
    ),
    Param("top_k", "int", 50, minimum=0, help="sample among the k likeliest codes; 0: off"),
    Param(
        "top_p",
        "float",
        0.95,
        minimum=0,
        maximum=1,
        exclusive_minimum=True,
        help="sample within this probability mass; 1: off",
    ),
    Param(
        "repetition_penalty",
        "float",
        1.05,
        minimum=0,
        exclusive_minimum=True,
        help="divides the scores of codes already written; 1: off",
    ),
    Param(
        "max_frames",
        "int",
        None,
        minimum=1,
        help="the most code frames (75 per second); none: 4 x text bytes + 16",
    ),
    Param(
        "chunk_frames",
        "int",
        16,
        minimum=1,
        maximum=MAX_CHUNK_FRAMES,
        help="code frames per streamed chunk",
    ),
    Param(
        "voice",
        "path",
        None,
        help="a voice (prepare_voice folder or .wav) in an allowed folder; none: the model's",
    ),
)


@attrs.frozen(kw_only=True)
class SynthesisParams:
    """One request's settings, typed: ``PARAMS`` read into attributes of the same names.

    ``temperature``, ``top_k`` (0: off), ``top_p`` (1: off) and ``repetition_penalty`` (1: off)
    shape the sampling of each code frame; ``max_frames`` bounds the length (None: from the
    text's length); ``chunk_frames`` is how many frames each streamed chunk holds; ``voice`` is a
    voice folder or a WAV file (None: the model's own voice).
    """

    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    max_frames: int | None
    chunk_frames: int
    voice: str | None

    @classmethod
    def from_params(cls, params: Mapping[str, object]) -> SynthesisParams:
        """The declared params from ``params``, each through its declaration: the host's checked
        values pass as they are; a caller that bypasses the host gets the same checks and
        defaults. Keys not declared here are left alone."""
        if not isinstance(params, Mapping):
            raise InvalidRequest(
                f"params: expected a mapping, got {type(params).__name__}", {"field": "params"}
            )
        return cls(**{p.name: p.check(params.get(p.name)) for p in PARAMS})  # type: ignore[arg-type]
