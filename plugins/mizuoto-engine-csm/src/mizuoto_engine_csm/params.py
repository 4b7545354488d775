"""The params this engine reads: declared once, here, for the manifest (plugin.py).

The host checks each request against ``PARAMS`` before the engine runs, so every bad value is an
InvalidRequest naming ``params.<name>``. ``temperature``, ``top_k`` and ``max_frames`` default to
None: the model's generation_config.json decides, as ``generate`` lets it. ``seed`` is the host's.
Torch-free: plugin.py imports this module to list the engine.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from mizuoto_sdk import InvalidRequest, Param

MAX_CHUNK_FRAMES = 4096
MAX_SPEAKER = 999  # a speaker is rendered as its decimal digits, "[0]" ... "[999]"
MAX_TRANSCRIPT_CHARS = 2000

PARAMS: tuple[Param, ...] = (
    Param(
        "speaker",
        "int",
        0,
        minimum=0,
        maximum=MAX_SPEAKER,
        help="the speaker id of the turn to speak ([0]text); a voice keeps its own for context",
    ),
    Param(
        "temperature",
        "float",
        None,
        minimum=0,
        exclusive_minimum=True,
        help="sampling temperature of each frame's first code; none: generation_config.json",
    ),
    Param(
        "top_k",
        "int",
        None,
        minimum=0,
        help="sample the first code among the k likeliest; 0: off; none: generation_config.json",
    ),
    Param(
        "max_frames",
        "int",
        None,
        minimum=1,
        help="the most code frames (12.5 per second); none: generation_config.json's "
        "max_new_tokens",
    ),
    Param(
        "chunk_frames",
        "int",
        8,
        minimum=0,
        maximum=MAX_CHUNK_FRAMES,
        help="code frames per streamed chunk; 0: decode once at the end (bitwise upstream)",
    ),
    Param(
        "voice",
        "path",
        None,
        help="a voice folder made by prepare_voice, in an allowed folder: its turn is context",
    ),
    Param(
        "transcript",
        "str",
        None,
        help="prepare_voice only: the words spoken in the recording (none: a turn without words)",
    ),
)


@attrs.frozen(kw_only=True)
class SynthesisParams:
    """One request's settings, typed: ``PARAMS`` read into attributes of the same names.

    None for ``temperature``, ``top_k`` and ``max_frames`` means the model's generation config.
    """

    speaker: int
    temperature: float | None
    top_k: int | None
    max_frames: int | None
    chunk_frames: int
    voice: str | None
    transcript: str | None

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
