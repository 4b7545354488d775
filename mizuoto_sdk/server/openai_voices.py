"""An engine's voices as the OpenAI route and Wyoming name them, and the param each one sets.

An engine has the voice ``default`` (its own: no ``voice`` param sent) and, when its manifest
declares a ``voice`` param, one voice per value that param lists in ``choices``, or, for a free
``voice`` (a ``str`` or ``path``), one per voice prepared for it in the data folder's ``voices``
folder (``POST /api/v1/voices`` or ``mizuoto voice prepare``), sent as ``ENGINE/NAME``, the form
``voices.roots`` resolves. Standard library only: Wyoming uses it without the server extra.
"""

from __future__ import annotations

from pathlib import Path

from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.manifest import EngineManifest

DEFAULT = "default"
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "cedar", "coral", "echo", "fable"}
    | {"marin", "nova", "onyx", "sage", "shimmer", "verse"}
)
"""OpenAI's own voice names: a client that hard-codes one gets the engine's default voice."""


def voices(manifest: EngineManifest, folder: Path) -> dict[str, str | None]:
    """Each voice's name -> the value of ``params.voice`` it sends (None: send none), ``default``
    first; ``folder`` is the data folder's ``voices``."""
    named: dict[str, str | None] = {DEFAULT: None}
    param = next((p for p in manifest.params if p.name == "voice"), None)
    if param is None:
        return named
    if param.choices is not None:
        named.update((str(choice), str(choice)) for choice in param.choices)
        return named
    if param.type in ("str", "path"):
        own = folder / manifest.id
        prepared = sorted(p.name for p in own.iterdir() if p.is_dir()) if own.is_dir() else []
        named.update((name, f"{manifest.id}/{name}") for name in prepared)
    return named


def voice_param(manifest: EngineManifest, folder: Path, voice: str, field: str) -> str | None:
    """The ``params.voice`` of ``voice`` (None: the engine's own); an OpenAI voice name the engine
    does not have is its default. An unknown voice is an InvalidRequest naming ``field``."""
    known = voices(manifest, folder)
    if voice in known:
        return known[voice]
    if voice in OPENAI_VOICES:
        return None
    raise InvalidRequest(
        f"{field}: engine {manifest.id!r} has no voice {voice!r}; its voices: {', '.join(known)}",
        {"field": field, "known": list(known)},
    )
