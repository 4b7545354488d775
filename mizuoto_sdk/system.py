"""What an engine needs besides Python packages: programs and shared libraries, each with the
command that installs it and, optionally, a cheap torch-free probe."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from mizuoto_sdk._checks import IMPLEMENTATION as _IMPLEMENTATION
from mizuoto_sdk._checks import matches as _matches

__all__ = ["Library", "Program"]


def _command(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        owner = type(instance).__name__
        raise ValueError(
            f"{owner}.{attribute.name}: expected a non-empty string such as "
            f"'apt install espeak-ng', got {value!r}"
        )


def _system_name(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        owner = type(instance).__name__
        raise ValueError(
            f"{owner}.{attribute.name}: expected a name without spaces such as 'espeak-ng', "
            f"got {value!r}"
        )


_probe = attrs.validators.optional(_matches(_IMPLEMENTATION, "mizuoto_engine_x.checks:espeak_ok"))


@attrs.frozen
class Program:
    """A program the engine runs (``espeak-ng``, ``ffmpeg``) and the command that installs it.

    The host looks ``name`` up on PATH (``shutil.which``). ``probe``, ``"pkg.module:function"``,
    replaces that lookup with the engine's own check: a cheap function that must not import
    torch and returns None when the program is usable, else a sentence saying why not (too old,
    a voice missing). ``install`` is what the user is told to run when it is missing.
    """

    name: str = attrs.field(validator=_system_name)
    install: str = attrs.field(validator=_command)
    probe: str | None = attrs.field(default=None, validator=_probe)


@attrs.frozen
class Library:
    """A shared library the engine loads (``sndfile`` for libsndfile) and how to install it.

    The host looks ``name`` up as ``ctypes.util.find_library`` does (the name without ``lib``
    and suffix); ``probe`` and ``install`` are as for ``Program``.
    """

    name: str = attrs.field(validator=_system_name)
    install: str = attrs.field(validator=_command)
    probe: str | None = attrs.field(default=None, validator=_probe)


def _system_items(kind: str, cls: type[Any], values: Iterable[Any]) -> tuple[Any, ...]:
    items = (values,) if isinstance(values, str | cls) else tuple(values)
    wrong = [v for v in items if not isinstance(v, cls)]
    if wrong:
        raise ValueError(f"{kind}: expected {cls.__name__} values, got {wrong[0]!r}")
    names = [v.name for v in items]
    if len(set(names)) != len(names):
        raise ValueError(f"{kind}: {names} names one twice")
    return items


def programs_of(values: Iterable[Program]) -> tuple[Program, ...]:
    return _system_items("programs", Program, values)


def libraries_of(values: Iterable[Library]) -> tuple[Library, ...]:
    return _system_items("libraries", Library, values)
