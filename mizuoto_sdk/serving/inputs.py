"""What a call's inputs must be, checked by every handle before any engine sees them.

Each check raises ``InvalidRequest`` naming the field; a handle adds its own detail (the engine,
the device) on the way out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.types import AudioChunk

INPUTS: Mapping[str, tuple[str, ...]] = {
    "synthesize": ("text",),
    "convert": ("audio",),
    "edit": ("audio", "text"),
}
"""The streaming capabilities and the inputs each takes, in order."""


def checked_text(text: object) -> str:
    if not isinstance(text, str):
        raise _invalid("text", f"expected a string, got {type(text).__name__}")
    if not text.strip():
        raise _invalid("text", "is empty")
    return text


def checked_audio(audio: object) -> AudioChunk:
    if not isinstance(audio, AudioChunk):
        raise _invalid("audio", f"expected an AudioChunk, got {type(audio).__name__}")
    return audio


def collected_inputs(capability: object, arguments: Sequence[object]) -> dict[str, object]:
    """``collect(capability, *arguments)``'s inputs by name, each checked."""
    names = INPUTS.get(capability) if isinstance(capability, str) else None
    if names is None:
        raise _invalid("capability", f"expected one of {', '.join(INPUTS)}, got {capability!r}")
    if len(arguments) != len(names):
        raise _invalid(
            names[0], f"{capability} takes {', '.join(names)}; got {len(arguments)} argument(s)"
        )
    return {
        name: checked_text(value) if name == "text" else checked_audio(value)
        for name, value in zip(names, arguments, strict=True)
    }


def _invalid(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {message}", {"field": field})
