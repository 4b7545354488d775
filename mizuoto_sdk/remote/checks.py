"""What a host's frame must hold before an agent acts on it: each field of the type the agent
reads it as. A wrong one is an ``InvalidRequest`` naming the field, which the session sends back
as an error frame and goes on; nothing a host sends can end a session's thread. (An engine's own
params are the engine's to check.)"""

from __future__ import annotations

from collections.abc import Mapping

from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.frames import FrameError, audio_from_fields

__all__ = ["check_request", "is_id", "shown"]

_CAPABILITIES = ("synthesize", "convert", "edit", "collect", "prepare_voice", "call")
_STREAMS = ("synthesize", "convert", "edit")
_AUDIO = {"convert", "edit", "prepare_voice"}
_TEXT = {"synthesize", "edit"}


def is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def shown(value: object) -> str:
    """A peer's value in a message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def check_request(header: Mapping[str, object], payload: bytes) -> None:
    """The request frame's own fields, each of the type ``served.py`` reads it as; a wrong one
    is named (the engine's params are the engine's to check)."""
    capability = header.get("capability")
    if capability not in _CAPABILITIES:
        raise InvalidRequest(
            f"capability: expected one of {', '.join(_CAPABILITIES)}, got {shown(capability)}",
            {"field": "capability"},
        )
    timeout = header.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
    ):
        raise InvalidRequest(
            f"timeout: expected seconds > 0 or null, got {shown(timeout)}", {"field": "timeout"}
        )
    of = header.get("of")
    if capability == "collect" and of not in _STREAMS:
        raise InvalidRequest(
            f"of: expected synthesize, convert or edit, got {shown(of)}", {"field": "of"}
        )
    inputs = {str(of)} if capability == "collect" else {str(capability)}
    if inputs & _TEXT and not isinstance(header.get("text"), str):
        raise InvalidRequest(
            f"text: expected a string, got {shown(header.get('text'))}", {"field": "text"}
        )
    audio = header.get("audio")
    if inputs & _AUDIO:
        try:
            if not isinstance(audio, dict):
                raise FrameError(f"expected an object, got {shown(audio)}")
            audio_from_fields(audio, payload)
        except FrameError as error:
            raise InvalidRequest(f"audio: {error}", {"field": "audio"}) from None
    if capability == "call" and not isinstance(header.get("op"), str):
        raise InvalidRequest(
            f"op: expected a string, got {shown(header.get('op'))}", {"field": "op"}
        )
