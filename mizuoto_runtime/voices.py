"""Where a request may name a voice: inside allowed folders only, with one answer for the rest.

A request's ``params["voice"]`` is a path chosen by whoever sends the request, which on a server
is not whoever runs the machine. Reading any path it names would let a request read any file
the process can, and an error that says "no such file" for some paths and "not a WAV file" for
others would tell it which files exist. So a voice resolves only inside allowed roots: the
engine's own voice folders and the folders the operator lists in the setting ``voices.roots``
(which reaches engines as ``ctx.settings["voices.roots"]``). Every path outside them, missing,
or of the wrong kind gets the same ``InvalidRequest``, which repeats only what the request sent.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from mizuoto_sdk.errors import InvalidRequest

ROOTS_SETTING = "voices.roots"


def voice_roots(settings: Mapping[str, object], *own: str | os.PathLike[str] | None) -> list[Path]:
    """The engine's own voice folders (None ones skipped), then those ``voices.roots`` names."""
    listed = settings.get(ROOTS_SETTING) or ()
    if isinstance(listed, str | os.PathLike):
        listed = (listed,)
    # voices.roots is a setting (object): a path or a list of paths
    folders = [*(folder for folder in own if folder is not None), *listed]  # type: ignore[misc]  # paths
    return [Path(os.path.abspath(folder)) for folder in folders]


def find_voice(
    value: object,
    roots: Iterable[str | os.PathLike[str]],
    *,
    field: str = "params.voice",
    suffixes: tuple[str, ...] = (".wav",),
) -> Path:
    """The resolved path ``value`` names inside one of ``roots``: a folder, or a file whose
    suffix is one of ``suffixes``.

    A relative ``value`` is looked up in each root in turn; an absolute one must lie inside a
    root once every link is followed. Anything else raises the same ``InvalidRequest``.
    """
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise InvalidRequest(
            f"{field}: expected the name or path of a voice, got {value!r}", {"field": field}
        )
    text = os.fspath(value)
    trees = [_resolved(root) for root in roots]
    if "\0" not in text:
        path = Path(text)
        candidates = [path] if path.is_absolute() else [tree / path for tree in trees if tree]
        for candidate in candidates:
            found = _resolved(candidate)
            if found is None or not any(tree and found.is_relative_to(tree) for tree in trees):
                continue
            try:
                if found.is_dir() or (found.is_file() and found.suffix.lower() in suffixes):
                    return found
            except OSError:  # unreadable, or a name too long: the same answer as missing
                continue
    raise InvalidRequest(
        f"{field}: {text!r} is not a voice in the allowed voice folders (the engine's own voices "
        f"and those the setting {ROOTS_SETTING} names); give a voice's name or path inside one",
        {"field": field},
    )


def _resolved(path: str | os.PathLike[str]) -> Path | None:
    try:
        return Path(path).resolve(strict=False)
    except (OSError, RuntimeError, ValueError):
        return None
