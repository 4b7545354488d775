"""Host settings as dotted keys, validated when they are set.

``compute.*`` keys shape how every engine runs; they are the fields of ``ComputeSettings``
(``mizuoto_sdk.compute``), which holds their defaults and checks, and every call reads them as
``ctx.compute``. ``engines.<id>.*`` keys belong to one engine, and
changing one unloads that engine so the next request reloads it with the new value; among them
the deployment keys (``replicas``, ``devices``, ``deployment``, ``execution_timeout``,
``restart``, ``threads``) are checked here one by one and against each other and the engine's
manifest by ``mizuoto_sdk.serving.plan`` before any worker process starts.
``engines.<id>.parallel`` (how a replica is cut across ranks, ``mizuoto_sdk.parallel``) is a
mapping stored whole; a dotted key under it (``engines.<id>.parallel.dense.tp_size``) sets one
size and merges into it, and the merged config is checked whole.
``voices.roots`` names the folders a voice may be read from; ``models.cache`` the folder
models are pulled into.

A value is checked completely when it is set, including the limits its first use depends on
(finite numbers, a simulated device of at least one byte), so a setting that was accepted never
fails later in a load.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from mizuoto_sdk.compute import ATTENTION_POLICIES, ComputeSettings
from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.manifest import canonical_device, canonical_dtype
from mizuoto_sdk.parallel import ParallelConfig
from mizuoto_sdk.serving.plan import DEPLOYMENT_FIELDS, HOST_NAME, remote_device


def _device(key: str, value: object) -> str:
    """A device of this machine (``cuda:0``), or ``<name>/<device>`` on the agent ``<name>``."""
    try:
        split = remote_device(value)  # type: ignore[arg-type]  # None for a non-string
        return canonical_device(value) if split is None else "/".join(split)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise InvalidRequest(f"{key}: {error}", {"field": key}) from None


def _dtype(key: str, value: object) -> str:
    try:
        return canonical_dtype(value)  # type: ignore[arg-type]  # raises TypeError for a non-string
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


def _seconds(key: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidRequest(
            f"{key}: expected a finite number of seconds > 0, got {value!r}", {"field": key}
        )
    return float(value)


def _address(key: str, value: object) -> str:
    """``HOST:PORT`` (an IPv6 host in brackets: ``[::1]:7373``)."""
    host, colon, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if not colon or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidRequest(
            f"{key}: expected HOST:PORT such as 192.0.2.7:7373, got {value!r}", {"field": key}
        )
    return str(value)


def _file(key: str, value: object) -> str:
    """A file path, stored absolute (``~`` expanded); read when it is used."""
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise InvalidRequest(f"{key}: expected a file path, got {value!r}", {"field": key})
    path = os.fspath(value)
    if "\0" in path:
        raise InvalidRequest(f"{key}: the path holds a NUL character", {"field": key})
    return os.path.abspath(os.path.expanduser(path))


def _mapping(key: str, value: object) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidRequest(
            f"{key}: expected a mapping with string keys, got {value!r}", {"field": key}
        )
    return dict(value)


def _parallel(key: str, value: object) -> dict[str, dict[str, int]]:
    return ParallelConfig.from_mapping(value, key).as_mapping()


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


def _folder(key: str, value: object) -> str:
    """One folder path, stored absolute."""
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise InvalidRequest(f"{key}: expected a folder path, got {value!r}", {"field": key})
    return _folders(key, value)[0]


# Settings besides compute.*: folders that params["voice"] may name voices in, besides each
# engine's own (engines read it from ctx.settings; see docs/host/settings.md).
# models.cache: the folder models are pulled into (default $MIZUOTO_HOME/models; host/models.py).
OTHER_KEYS: Mapping[str, Callable[[str, object], object]] = {
    "voices.roots": _folders,
    "models.cache": _folder,
    # remote engines: how long the agent may be silent; how often an agent sends a heartbeat
    "remote.heartbeat_timeout": _seconds,
    "remote.heartbeat_interval": _seconds,
    # how long a remote session may take to connect and load its model (remote/client.py)
    "remote.load_timeout": _seconds,
    # how long a stopping process waits for its calls in flight to unwind (host/stopping.py)
    "host.stop_timeout": _seconds,
}
# remote.hosts.<name>.<field>: the agent an engine device "<name>/<device>" runs on.
REMOTE_HOST_FIELDS: Mapping[str, Callable[[str, object], object]] = {
    "address": _address,
    "token_file": _file,
    "tls": _boolean,
    "tls_ca": _file,
}
ENGINE_FIELDS: Mapping[str, Callable[[str, object], object]] = {
    "device": _device,
    "dtype": _dtype,
    "model": _string,
    # a folder of the user's that the engine loads its current model from instead of the
    # model's declared source (host/models.py checks it holds the model's required_files)
    "model_dir": _folder,
    "variant": _string,
    "options": _mapping,
    "pinned": _boolean,
    "parallel": _parallel,
    **DEPLOYMENT_FIELDS,  # replicas, devices, deployment, execution_timeout, restart, threads
}
DEFAULTS: Mapping[str, object] = {
    **ComputeSettings().as_settings(),
    "voices.roots": (),
    "models.cache": None,  # None: $MIZUOTO_HOME/models, else the user data folder
    "remote.heartbeat_timeout": 60.0,
    "remote.heartbeat_interval": 5.0,
    "remote.load_timeout": 600.0,
    "host.stop_timeout": 10.0,
}

__all__ = [
    "ATTENTION_POLICIES",
    "DEFAULTS",
    "ENGINE_FIELDS",
    "OTHER_KEYS",
    "REMOTE_HOST_FIELDS",
    "Settings",
]

Listener = Callable[[str, object], None]


class Settings:
    """A validated mapping of dotted keys, with listeners told of every change.

    ``compute`` is the ``compute.*`` keys as one ``ComputeSettings``. A retired key
    (``compute.fast``) warns (DeprecationWarning) and is not stored.
    """

    def __init__(self, values: Mapping[str, object] | None = None) -> None:
        self._values: dict[str, object] = dict(DEFAULTS)
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self._compute: ComputeSettings | None = None
        for key, value in (values or {}).items():
            if self._known(key):
                key, value = self._merged(key, value)
                self._values[key] = self._validate(key, value)

    @property
    def compute(self) -> ComputeSettings:
        """The current ``compute.*`` values, typed (a new object after each change)."""
        with self._lock:
            if self._compute is None:
                self._compute = ComputeSettings.from_settings(self._values)
            return self._compute

    def get(self, key: str, default: object = None) -> Any:
        return self._values.get(key, default)

    def engine(self, engine_id: str, field: str, default: object = None) -> Any:
        return self._values.get(f"engines.{engine_id}.{field}", default)

    def set(self, key: str, value: object) -> None:
        """Validate and store ``value``; listeners hear of it only when it changed.

        A key under ``engines.<id>.parallel`` merges into that mapping, which is what is stored
        and what listeners hear of.
        """
        if not self._known(key):
            return
        with self._lock:  # a merge reads the current mapping: check and store it in one step
            key, value = self._merged(key, value)
            value = self._validate(key, value)
            changed = self._values.get(key) != value
            self._values[key] = value
            if changed and key in DEFAULTS:
                self._compute = None
            listeners = list(self._listeners)
        if changed:
            for listener in listeners:
                listener(key, value)

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def as_dict(self) -> dict[str, object]:
        return dict(self._values)

    @staticmethod
    def stored_key(key: str) -> str:
        """The key a value set under ``key`` is stored as: ``engines.<id>.parallel`` for a key
        below it, else ``key``."""
        parts = key.split(".") if isinstance(key, str) else []
        if len(parts) > 3 and parts[0] == "engines" and parts[2] == "parallel":
            return ".".join(parts[:3])
        return key

    def _merged(self, key: str, value: object) -> tuple[str, object]:
        """``(key, value)``, or for a key below ``engines.<id>.parallel`` that mapping's key and
        the current mapping with ``value`` put at its place (checked whole by ``_validate``)."""
        stored = self.stored_key(key)
        if stored == key:
            return key, value
        below = key.split(".")[3:]
        if len(below) > 2:
            raise InvalidRequest(
                f"{key}: expected {stored}.<domain>.<size> such as {stored}.dense.tp_size",
                {"field": key},
            )
        current = self._values.get(stored)
        merged: dict[str, object] = {}
        for name, sizes in current.items() if isinstance(current, Mapping) else ():
            merged[name] = dict(sizes) if isinstance(sizes, Mapping) else sizes
        if len(below) == 1:
            merged[below[0]] = value
        else:
            table = merged.setdefault(below[0], {})
            if isinstance(table, dict):
                table[below[1]] = value
        return stored, merged

    @staticmethod
    def _known(key: object) -> bool:
        """False for a retired ``compute.*`` key, after warning that it is ignored."""
        if (why := ComputeSettings.retired(key)) is not None:
            warnings.warn(why, DeprecationWarning, stacklevel=3)
            return False
        return True

    @staticmethod
    def _validate(key: str, value: object) -> object:
        if not isinstance(key, str):
            raise InvalidRequest(f"setting keys are strings, got {key!r}", {"field": str(key)})
        name = ComputeSettings.field_of(key)
        if name is not None:
            checked: Any = value  # the field's own validator checks it
            return getattr(ComputeSettings(**{name: checked}), name)
        if key in OTHER_KEYS:
            return OTHER_KEYS[key](key, value)
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "engines" and parts[2] in ENGINE_FIELDS:
            return ENGINE_FIELDS[parts[2]](key, value)
        if len(parts) == 4 and parts[:2] == ["remote", "hosts"] and parts[3] in REMOTE_HOST_FIELDS:
            if not HOST_NAME.fullmatch(parts[2]):
                raise InvalidRequest(
                    f"{key}: {parts[2]!r} is not an agent name; a name is letters, digits, '-' "
                    "and '_'",
                    {"field": key},
                )
            return REMOTE_HOST_FIELDS[parts[3]](key, value)
        known = [
            *(f"compute.{name}" for name in ComputeSettings.names()),
            *OTHER_KEYS,
            *(f"engines.<id>.{f}" for f in ENGINE_FIELDS),
            "engines.<id>.parallel.<domain>.<size>",
            *(f"remote.hosts.<name>.{f}" for f in REMOTE_HOST_FIELDS),
        ]
        raise InvalidRequest(
            f"unknown setting {key!r}; known settings: {', '.join(known)}", {"field": key}
        )
