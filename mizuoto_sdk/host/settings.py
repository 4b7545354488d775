"""Host settings as dotted keys, validated when they are set.

``compute.*`` keys shape how every engine runs; ``engines.<id>.*`` keys belong to one engine, and
changing one unloads that engine so the next request reloads it with the new value.
``voices.roots`` names the folders a voice may be read from.

A value is checked completely when it is set, including the limits its first use depends on
(finite numbers, a simulated device of at least one byte), so a setting that was accepted never
fails later in a load.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.manifest import canonical_dtype, device_type


def _positive_int_or_none(key: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest(
            f"{key}: expected an integer >= 1 or None, got {value!r}", {"field": key}
        )
    return value


def _finite(value: float) -> bool:
    """Whether ``value`` is a float that is not inf or NaN (an int too large for one is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _number_or_none(
    what: str, minimum: float, *, exclusive: bool = False, least: tuple[float, str] | None = None
) -> Callable[[str, object], float | None]:
    """A check for None or a finite real number >= ``minimum`` (> with ``exclusive``).

    ``least`` = (value, words) adds a smallest usable value that the bound alone does not say
    (a simulated device of 1e-9 MiB is > 0 but holds no byte).
    """
    bound = f"{'>' if exclusive else '>='} {minimum:g}"
    if least is not None:
        bound += f" (at least {least[1]})"

    def check(key: str, value: object) -> float | None:
        if value is None:
            return None
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if (
            not number
            or not _finite(value)  # type: ignore[arg-type]
            or not (value > minimum if exclusive else value >= minimum)  # type: ignore[operator]
            or (least is not None and value < least[0])  # type: ignore[operator]
        ):
            raise InvalidRequest(
                f"{key}: expected {what} {bound}, finite, or None, got {value!r}", {"field": key}
            )
        return value  # type: ignore[return-value]

    return check


def _device(key: str, value: object) -> str:
    try:
        device_type(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise InvalidRequest(f"{key}: {error}", {"field": key}) from None
    return value  # type: ignore[return-value]


def _dtype(key: str, value: object) -> str:
    try:
        return canonical_dtype(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise InvalidRequest(f"{key}: {error}", {"field": key}) from None


def _string(key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{key}: expected a non-empty string, got {value!r}", {"field": key})
    return value


def _boolean(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{key}: expected true or false, got {value!r}", {"field": key})
    return value


def _mapping(key: str, value: object) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidRequest(
            f"{key}: expected a mapping with string keys, got {value!r}", {"field": key}
        )
    return dict(value)


def _folders(key: str, value: object) -> tuple[str, ...]:
    """A list of folder paths, stored absolute (relative ones are taken from the current folder
    when the setting is set, so a later change of folder does not move them)."""
    items = [value] if isinstance(value, str | os.PathLike) else value
    if not isinstance(items, list | tuple) or not all(
        isinstance(item, str | os.PathLike) and os.fspath(item) for item in items
    ):
        raise InvalidRequest(
            f"{key}: expected a list of folder paths, got {value!r}", {"field": key}
        )
    if any("\0" in os.fspath(item) for item in items):
        raise InvalidRequest(f"{key}: a folder path holds a NUL character", {"field": key})
    return tuple(os.path.abspath(os.fspath(item)) for item in items)


def _choice(*allowed: str) -> Callable[[str, object], str]:
    def check(key: str, value: object) -> str:
        if value not in allowed:
            raise InvalidRequest(
                f"{key}: expected one of {', '.join(allowed)}, got {value!r}", {"field": key}
            )
        return value  # type: ignore[return-value]

    return check


ATTENTION_POLICIES = ("auto", "sdpa", "math", "flash", "xformers", "sage")

COMPUTE_KEYS: Mapping[str, Callable[[str, object], object]] = {
    "compute.max_resident_models": _positive_int_or_none,
    "compute.attention": _choice(*ATTENTION_POLICIES),
    "compute.kv_cache": _choice("dynamic", "static"),
    "compute.compile": _boolean,
    "compute.cuda_graphs": _boolean,
    "compute.fast": _boolean,
    # Memory management (mizuoto_runtime.memory.policy): simulate_vram_mb when the runtime is created
    # (the first load), the others each time a model registers on a device.
    "compute.simulate_vram_mb": _number_or_none(
        "a number of MiB", 0, exclusive=True, least=(2**-20, "one byte, 2**-20")
    ),
    "compute.vram_headroom_mb": _number_or_none("a number of MiB", 0),
    "compute.stream_in_flight": _positive_int_or_none,
    "compute.working_margin": _number_or_none("a factor", 1),
    # Folders that params["voice"] may name voices in, besides each engine's own (engines read
    # it from ctx.settings; see docs/host/settings.md).
    "voices.roots": _folders,
}
ENGINE_FIELDS: Mapping[str, Callable[[str, object], object]] = {
    "device": _device,
    "dtype": _dtype,
    "model": _string,
    "variant": _string,
    "options": _mapping,
    "pinned": _boolean,
}
DEFAULTS: Mapping[str, object] = {
    "compute.max_resident_models": None,
    "compute.attention": "auto",
    "compute.kv_cache": "dynamic",
    "compute.compile": False,
    "compute.cuda_graphs": False,
    "compute.fast": False,
    "compute.simulate_vram_mb": None,
    "compute.vram_headroom_mb": None,
    "compute.stream_in_flight": None,
    "compute.working_margin": None,
    "voices.roots": (),
}

Listener = Callable[[str, object], None]


class Settings:
    """A validated mapping of dotted keys, with listeners told of every change."""

    def __init__(self, values: Mapping[str, object] | None = None) -> None:
        self._values: dict[str, object] = dict(DEFAULTS)
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        for key, value in (values or {}).items():
            self._values[key] = self._validate(key, value)

    def get(self, key: str, default: object = None) -> Any:
        return self._values.get(key, default)

    def engine(self, engine_id: str, field: str, default: object = None) -> Any:
        return self._values.get(f"engines.{engine_id}.{field}", default)

    def set(self, key: str, value: object) -> None:
        """Validate and store ``value``; listeners hear of it only when it changed."""
        value = self._validate(key, value)
        with self._lock:
            changed = self._values.get(key) != value
            self._values[key] = value
            listeners = list(self._listeners)
        if changed:
            for listener in listeners:
                listener(key, value)

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def as_dict(self) -> dict[str, object]:
        return dict(self._values)

    @staticmethod
    def _validate(key: str, value: object) -> object:
        if not isinstance(key, str):
            raise InvalidRequest(f"setting keys are strings, got {key!r}", {"field": str(key)})
        if key in COMPUTE_KEYS:
            return COMPUTE_KEYS[key](key, value)
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "engines" and parts[2] in ENGINE_FIELDS:
            return ENGINE_FIELDS[parts[2]](key, value)
        known = [*COMPUTE_KEYS, *(f"engines.<id>.{f}" for f in ENGINE_FIELDS)]
        raise InvalidRequest(
            f"unknown setting {key!r}; known settings: {', '.join(known)}", {"field": key}
        )
