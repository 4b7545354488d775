"""Where the host's settings come from: defaults, settings files, then ``--set``.

Layers, each on top of the one before: the defaults (``mizuoto_sdk.host.settings.DEFAULTS``), the
user's settings file (``settings.toml`` in the platform's user config folder, when it exists), the
file named by ``MIZUOTO_SETTINGS`` (it must exist), and ``--set KEY=VALUE`` arguments. A file is
TOML; tables spell the dotted keys (``[compute]`` then ``attention = "sdpa"``, or
``[engines.sine]`` then ``device = "cpu"``). A bad key or value is an ``InvalidRequest`` that names
the file and the line, so a mistake in a file is found where it was made, not on a later load.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import platformdirs

from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.host.settings import DEFAULTS, OTHER_KEYS, Settings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the backport has the same interface
    import tomli as tomllib

__all__ = ["SETTINGS_VARIABLE", "effective_settings", "parse_override", "user_settings_file"]

SETTINGS_VARIABLE = "MIZUOTO_SETTINGS"
DEFAULT = "default"
OVERRIDE = "--set"


def user_settings_file() -> Path:
    """``settings.toml`` in the user's config folder (``~/.config/mizuoto`` on Linux)."""
    return Path(platformdirs.user_config_dir("mizuoto")) / "settings.toml"


def effective_settings(
    overrides: Sequence[str] = (),
    *,
    user_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[Settings, dict[str, str]]:
    """The settings this process runs with, and where each key's value came from.

    ``overrides`` are ``KEY=VALUE`` strings (``--set``). The second value maps every effective
    key to ``"default"``, a settings file's path, or ``"--set"``. ``user_file`` and ``environ``
    replace the user's settings file and ``os.environ`` (tests point them elsewhere).
    """
    environ = os.environ if environ is None else environ
    parsed = [(override, *parse_override(override)) for override in overrides]
    settings = Settings()
    origin = dict.fromkeys(settings.as_dict(), DEFAULT)
    for path in _files(user_settings_file() if user_file is None else user_file, environ):
        text = _read(path)
        for key, value in _file_values(path, text):
            try:
                settings.set(key, value)
            except InvalidRequest as error:
                raise _located(error, path, _line_of(text, key), key) from None
            origin[Settings.stored_key(key)] = str(path)
    for override, key, value in parsed:
        try:
            settings.set(key, value)
        except InvalidRequest as error:
            raise InvalidRequest(
                f"--set {override}: {error}", {"field": key, "source": OVERRIDE}
            ) from None
        origin[Settings.stored_key(key)] = OVERRIDE
    return settings, {key: origin[key] for key in settings.as_dict() if key in origin}


def parse_override(text: str) -> tuple[str, object]:
    """``KEY=VALUE``: the value as TOML (``2``, ``true``, ``["a", "b"]``), else as a string."""
    key, equals, raw = text.partition("=")
    key = key.strip()
    if not equals or not key:
        raise InvalidRequest(
            f"--set {text!r}: expected KEY=VALUE, such as compute.attention=sdpa",
            {"field": "--set", "value": text},
        )
    try:
        value: object = tomllib.loads(f"value = {raw.strip()}")["value"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key, value


def _files(user_file: Path, environ: Mapping[str, str]) -> Iterator[Path]:
    if user_file.is_file():
        yield user_file
    named = environ.get(SETTINGS_VARIABLE)
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise InvalidRequest(
                f"{SETTINGS_VARIABLE} names {path}, which is not a file; create it or unset "
                f"{SETTINGS_VARIABLE}",
                {"field": SETTINGS_VARIABLE, "path": str(path)},
            )
        yield path


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        raise InvalidRequest(
            f"{path}: cannot read the settings file: {reason or error}", {"path": str(path)}
        ) from None


def _file_values(path: Path, text: str) -> list[tuple[str, object]]:
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        line = getattr(error, "lineno", None) or _decode_line(str(error))
        where = f"{path}:{line}" if line else str(path)
        raise InvalidRequest(
            f"{where}: not valid TOML: {error}", {"path": str(path), "line": line}
        ) from None
    return list(_flatten(table, ()))


def _flatten(table: Mapping[str, Any], prefix: tuple[str, ...]) -> Iterator[tuple[str, object]]:
    """Dotted keys from nested tables; a whole key's value stays whole, even when it is a table
    (``engines.<id>.options``). ``engines.<id>.parallel`` goes down to its sizes, so that files
    and ``--set`` each set only the sizes they name and the rest merge."""
    for name, value in table.items():
        path = (*prefix, name)
        key = ".".join(path)
        engine_key = len(path) == 3 and path[0] == "engines" and path[2] != "parallel"
        sizes = path[0] == "engines" and len(path) > 4  # engines.<id>.parallel.<domain>.<size>
        whole = key in DEFAULTS or key in OTHER_KEYS or engine_key or sizes
        if isinstance(value, dict) and not whole:
            yield from _flatten(value, path)
        else:
            yield key, value


def _decode_line(message: str) -> int | None:
    found = re.search(r"line (\d+)", message)
    return int(found.group(1)) if found else None


_KEY_PART = r'(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_KEY = rf"{_KEY_PART}(?:\s*\.\s*{_KEY_PART})*"
_HEADER = re.compile(rf"\s*\[\[?\s*({_KEY})\s*\]\]?\s*(?:#.*)?$")
_ASSIGNMENT = re.compile(rf"\s*({_KEY})\s*=")


def _parts(key: str) -> tuple[str, ...]:
    return tuple(
        part[1:-1] if part[:1] in "\"'" else part
        for part in (m.group(0) for m in re.finditer(_KEY_PART, key))
    )


def _line_of(text: str, key: str) -> int | None:
    """The line that sets ``key``: tomllib reports no positions for values, so scan the text
    for table headers and assignments (the first line whose full key is ``key`` or a table
    that holds it, as in ``engines = { sine = { dtype = "x" } }``)."""
    wanted = tuple(key.split("."))
    table: tuple[str, ...] = ()
    found: int | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if header := _HEADER.match(line):
            table = _parts(header.group(1))
            continue
        if assignment := _ASSIGNMENT.match(line):
            full = (*table, *_parts(assignment.group(1)))
            if full == wanted:
                return number
            if found is None and wanted[: len(full)] == full:
                found = number
    return found


def _located(error: InvalidRequest, path: Path, line: int | None, key: str) -> InvalidRequest:
    where = f"{path}:{line}" if line else str(path)
    return InvalidRequest(
        f"{where}: {error}", {**error.detail, "field": key, "path": str(path), "line": line}
    )
