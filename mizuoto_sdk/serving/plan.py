"""Where an engine's replicas run, decided from its settings before any process starts.

An engine's deployment settings (``engines.<id>.replicas``, ``devices``, ``deployment``,
``execution_timeout``, ``start_timeout``, ``restart``, ``threads``) are checked one by one when
they are set (``DEPLOYMENT_FIELDS``, which the host's settings merge into their engine fields) and
against each other and the engine's manifest here, so a deployment that cannot run fails with the
fix before a worker is spawned rather than as a dead worker later.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, cast

import attrs

from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.manifest import canonical_device, device_type
from mizuoto_sdk.parallel import ParallelConfig

__all__ = [
    "DEPLOYMENTS",
    "DEPLOYMENT_DEFAULTS",
    "DEPLOYMENT_FIELDS",
    "HOST_NAME",
    "RESTARTS",
    "Deployment",
    "Mode",
    "Restart",
    "plan_deployment",
    "remote_device",
]

Mode = Literal["inline", "local", "external", "remote"]
Restart = Literal["never", "on_failure"]

DEPLOYMENTS: tuple[str, ...] = ("auto", "inline", "local", "external")
RESTARTS: tuple[str, ...] = ("never", "on_failure")


HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
"""An agent's name: the ``<name>`` of ``remote.hosts.<name>`` and of ``<name>/<device>``."""


def remote_device(device: str) -> tuple[str, str] | None:
    """``"box/cuda:0"`` -> ``("box", "cuda:0")``: the agent's name (``remote.hosts.<name>``) and
    its device; None for a device of this machine. ``ValueError`` names what is wrong with a
    remote device that is malformed."""
    if not isinstance(device, str) or "/" not in device:
        return None
    name, _, local = device.partition("/")
    if not HOST_NAME.fullmatch(name):
        raise ValueError(
            f"device: {device!r} names the agent {name!r}; a name is letters, digits, '-' and "
            "'_' (the <name> of remote.hosts.<name>), as in 'box/cpu'"
        )
    try:
        local = canonical_device(local)
    except ValueError as error:
        raise ValueError(f"device: {device!r}: on the agent, {error}") from None
    return name, local


def _whole(key: str, value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest(
            f"{key}: expected a whole number >= 1 ({what}), got {value!r}", {"field": key}
        )
    return value


def _choice(key: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise InvalidRequest(
            f"{key}: expected one of {', '.join(choices)}, got {value!r}", {"field": key}
        )
    return value


def _replicas(key: str, value: object) -> int:
    return _whole(key, value, "complete copies of the model")


def _threads(key: str, value: object) -> int | None:
    """None: a worker uses the launching process's thread count, so its output equals inline."""
    return None if value is None else _whole(key, value, "torch threads per worker")


def _devices(key: str, value: object) -> tuple[str, ...] | None:
    """One device per rank of every replica; one string is a list of one device."""
    if value is None:
        return None
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise InvalidRequest(
            f'{key}: expected a non-empty list of devices such as ["cuda:0", "cuda:1"], '
            f"got {value!r}",
            {"field": key},
        )
    devices = []
    for item in items:
        try:  # one spelling per device: "cuda:01" is "cuda:1", "cpu:0" is "cpu"
            devices.append(canonical_device(item))
        except (TypeError, ValueError) as error:
            raise InvalidRequest(f"{key}: {error}", {"field": key}) from None
    return tuple(devices)


def _deployment(key: str, value: object) -> str:
    return _choice(key, value, DEPLOYMENTS)


def _execution_timeout(key: str, value: object) -> float | None:
    return None if value is None else _seconds(key, value)


def _seconds(key: str, value: object) -> float:
    try:
        seconds = float(value) if isinstance(value, int | float) else math.nan
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds <= 0:
        raise InvalidRequest(
            f"{key}: expected a finite number of seconds > 0, got {value!r}", {"field": key}
        )
    return seconds


def _restart(key: str, value: object) -> str:
    return _choice(key, value, RESTARTS)


# Field name -> validator(full dotted key, value) -> the value stored.
DEPLOYMENT_FIELDS: Mapping[str, Callable[[str, object], object]] = {
    "replicas": _replicas,
    "devices": _devices,
    "deployment": _deployment,
    "execution_timeout": _execution_timeout,
    "start_timeout": _seconds,
    "restart": _restart,
    "threads": _threads,
}
DEPLOYMENT_DEFAULTS: Mapping[str, object] = {
    "replicas": 1,
    "devices": None,  # None: the engine's device for every replica
    "deployment": "auto",
    "execution_timeout": None,  # None: a request may run as long as it needs
    "start_timeout": 600.0,  # seconds for a replica's workers to load and say ready
    "restart": "never",
    "threads": None,  # None: the launching process's count
}


def _replica_devices(
    value: Sequence[Sequence[str]],
) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(replica) for replica in value)


def _same_ranks(instance: object, attribute: object, value: tuple[tuple[str, ...], ...]) -> None:
    if not value or not value[0] or any(len(replica) != len(value[0]) for replica in value):
        raise ValueError(
            f"replicas: expected one or more replicas of the same number (>= 1) of devices, "
            f"got {value!r}"
        )


@attrs.frozen
class Deployment:
    """How one engine is served: where each replica runs and how failures are handled.

    ``mode`` ``"external"``: this process is one rank of a replica whose processes a launcher
    (torchrun) started; ``replicas`` is then that one replica, with the devices the settings
    name, and the launcher decides how many processes there are.
    """

    engine_id: str
    mode: Mode
    replicas: tuple[tuple[str, ...], ...] = attrs.field(
        converter=_replica_devices, validator=_same_ranks
    )
    """Per replica, the device of each of its ranks."""
    execution_timeout: float | None = None
    start_timeout: float = 600.0
    """Seconds for every worker of a replica to start and load the model."""
    restart: Restart = "never"
    threads: int | None = None
    parallel: ParallelConfig = attrs.field(
        factory=ParallelConfig, validator=attrs.validators.instance_of(ParallelConfig)
    )
    """How each replica is cut across its ranks."""

    @property
    def host(self) -> str | None:
        """The agent a ``"remote"`` deployment runs on (``remote.hosts.<name>``); else None."""
        if self.mode != "remote":
            return None
        split = remote_device(self.replicas[0][0])
        return None if split is None else split[0]

    @property
    def ranks(self) -> int:
        """Ranks (processes) per replica, as planned: ``parallel.ranks`` (for ``"external"``,
        the devices listed)."""
        return len(self.replicas[0])


def plan_deployment(
    engine_id: str,
    fields: Mapping[str, object],
    devices: Sequence[str],
    device: str | None = None,
    parallel: ParallelConfig | None = None,
) -> Deployment:
    """The deployment of ``engine_id``, or an ``InvalidRequest`` naming the setting to fix.

    ``fields``: the engine's settings by field name; a missing field or None takes its default,
    and fields that are not deployment settings are ignored. ``devices``: the device types the
    engine's manifest supports. ``device``: the engine's device (default ``"cpu"``), used for
    every replica when ``engines.<id>.devices`` is unset; when it is set, it wins. ``parallel``:
    the engine's ``engines.<id>.parallel`` (default: one rank per replica); the devices are one
    per rank of every replica, replicas x ranks in all.
    """
    values = {
        name: (
            DEPLOYMENT_DEFAULTS[name]
            if fields.get(name) is None
            else check(f"engines.{engine_id}.{name}", fields[name])
        )
        for name, check in DEPLOYMENT_FIELDS.items()
    }
    replicas = cast(int, values["replicas"])
    listed = cast("tuple[str, ...] | None", values["devices"])
    deployment = cast(str, values["deployment"])
    parallel = ParallelConfig() if parallel is None else parallel
    ranks = parallel.ranks
    key = f"engines.{engine_id}"

    if isinstance(device, str) and "/" in device:
        return _remote(engine_id, values, devices, device, parallel)
    if deployment == "external":
        return _external(engine_id, values, devices, device, parallel)
    if deployment == "auto":
        alone = replicas == 1 and ranks == 1 and listed is None
        deployment = "inline" if alone else "local"
    if deployment == "inline" and (
        replicas > 1 or ranks > 1 or (listed is not None and len(listed) > 1)
    ):
        what = (
            f"{replicas} replicas"
            if replicas > 1
            else f"{ranks} ranks per replica ({key}.parallel)"
            if ranks > 1
            else f"{len(listed or ())} devices"
        )
        raise InvalidRequest(
            f'{key}.deployment: "inline" runs one replica on one device in this process, but '
            f'the settings ask for {what}; set {key}.deployment = "local" (or "auto") to run '
            "them as worker processes",
            {"field": f"{key}.deployment"},
        )

    if listed is None:
        chosen = "cpu" if device is None else device
        _check_device(engine_id, chosen, devices, "device", f"set {key}.device")
        placed = [chosen] * (replicas * ranks)
    else:
        needed = replicas * ranks
        if len(listed) != needed:
            asked = f"{_count(replicas, 'replica')} of {_count(ranks, 'rank')}"
            fix = f"list {needed}"
            if len(listed) % ranks == 0:
                fix += f" or set {key}.replicas = {len(listed) // ranks}"
            raise InvalidRequest(
                f"{key}.devices lists {_count(len(listed), 'device')}; {asked} "
                f"need{'s' if needed == 1 else ''} {needed}, one per rank of every replica "
                f"(ranks per replica from {key}.parallel); {fix}",
                {"field": f"{key}.devices"},
            )
        for entry in listed:
            _check_device(engine_id, entry, devices, f"{key}.devices", f"change {key}.devices")
        placed = list(listed)

    return Deployment(
        engine_id=engine_id,
        mode=cast(Mode, deployment),
        replicas=[placed[i : i + ranks] for i in range(0, len(placed), ranks)],
        execution_timeout=cast("float | None", values["execution_timeout"]),
        start_timeout=cast(float, values["start_timeout"]),
        restart=cast(Restart, values["restart"]),
        threads=cast("int | None", values["threads"]),
        parallel=parallel,
    )


def _external(
    engine_id: str,
    values: Mapping[str, object],
    devices: Sequence[str],
    device: str | None,
    parallel: ParallelConfig,
) -> Deployment:
    """This process as one rank of the one replica a launcher started: the launcher, not the
    settings, says how many processes there are, so only the devices' types are checked."""
    key = f"engines.{engine_id}"
    if values["replicas"] != 1:
        raise InvalidRequest(
            f'{key}.deployment: "external" runs one replica across the processes the launcher '
            f"(torchrun) started, but {key}.replicas = {values['replicas']}; set "
            f"{key}.replicas = 1, or run several launches",
            {"field": f"{key}.replicas"},
        )
    listed = cast("tuple[str, ...] | None", values["devices"])
    if listed is None:
        chosen = "cpu" if device is None else device
        _check_device(engine_id, chosen, devices, "device", f"set {key}.device")
        placed = (chosen,) * parallel.ranks
    else:
        for entry in listed:
            _check_device(engine_id, entry, devices, f"{key}.devices", f"change {key}.devices")
        placed = listed
    return Deployment(
        engine_id=engine_id,
        mode="external",
        replicas=[placed],
        execution_timeout=cast("float | None", values["execution_timeout"]),
        start_timeout=cast(float, values["start_timeout"]),
        restart=cast(Restart, values["restart"]),
        threads=cast("int | None", values["threads"]),
        parallel=parallel,
    )


def _remote(
    engine_id: str,
    values: Mapping[str, object],
    devices: Sequence[str],
    device: str,
    parallel: ParallelConfig,
) -> Deployment:
    """One replica on an agent elsewhere (``<name>/<device>``): one session, one device."""
    key = f"engines.{engine_id}"
    fix = f"on this machine, set {key}.device to a local device"
    if values["replicas"] != 1 or parallel.ranks > 1 or values["devices"] is not None:
        field, what = (
            (f"{key}.replicas", f"{key}.replicas = {values['replicas']}")
            if values["replicas"] != 1
            else (f"{key}.parallel", f"{parallel.ranks} ranks ({key}.parallel)")
            if parallel.ranks > 1
            else (f"{key}.devices", f"{key}.devices")
        )
        raise InvalidRequest(
            f"{key}.device = {device!r} runs one replica of one rank on the agent, but the "
            f"settings ask for {what}; unset it for the remote engine, or {fix}",
            {"field": field},
        )
    if values["deployment"] != "auto":
        raise InvalidRequest(
            f"{key}.deployment = {values['deployment']!r} cannot run on the agent that "
            f"{key}.device = {device!r} names; set {key}.deployment = auto, or {fix}",
            {"field": f"{key}.deployment"},
        )
    try:
        split = remote_device(device)
    except ValueError as error:
        raise InvalidRequest(str(error), {"field": "device"}) from None
    assert split is not None  # it holds a "/"
    _check_device(engine_id, split[1], devices, "device", f"set {key}.device")
    return Deployment(
        engine_id=engine_id,
        mode="remote",
        replicas=[["/".join(split)]],  # "box/cpu:0" is "box/cpu": one model on the agent
        execution_timeout=cast("float | None", values["execution_timeout"]),
        start_timeout=cast(float, values["start_timeout"]),
        restart=cast(Restart, values["restart"]),
        threads=cast("int | None", values["threads"]),
        parallel=parallel,
    )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _check_device(
    engine_id: str, device: str, supported: Sequence[str], field: str, fix: str
) -> None:
    try:
        kind = device_type(device)
    except (TypeError, ValueError) as error:
        raise InvalidRequest(f"{field}: {error}", {"field": field}) from None
    if kind not in supported:
        raise InvalidRequest(
            f"{field}: engine {engine_id!r} runs on {', '.join(supported)}, not {device!r}; "
            f"{fix} to a device of those types",
            {"field": field},
        )
