"""The handle a deployment asks for, beyond one replica in this process.

``local``: a ``ReplicatedModel`` over worker processes (``mizuoto_sdk.serving``), each worker
told what to load, with which settings and engines, and, in a replica of several ranks, its part
of the parallel layout. ``external``: an ``ExternalModel``, this process being one rank that an
external launcher (torchrun) started. ``remote``: a ``RemoteModel``, the model running on a
``mizuoto agent`` elsewhere (``remote.hosts.<name>.*``). Each is imported when it is first built,
so a host that runs its models in process pays nothing at start-up for processes and sockets.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.host.binding import bind_process
from mizuoto_sdk.host.paths import staged_folder
from mizuoto_sdk.host.settings import DEFAULTS
from mizuoto_sdk.manifest import device_type
from mizuoto_sdk.serving.plan import remote_device

if TYPE_CHECKING:
    from mizuoto_runtime.runtime import Runtime
    from mizuoto_sdk.discovery import Discovery
    from mizuoto_sdk.host.external import ExternalModel
    from mizuoto_sdk.host.local import LocalEngine
    from mizuoto_sdk.host.settings import Settings
    from mizuoto_sdk.remote.model import RemoteModel
    from mizuoto_sdk.serving.handle import ReplicatedModel
    from mizuoto_sdk.serving.plan import Deployment


class DeployingHost(Protocol):
    """What building a deployment needs from the host (``RuntimeService`` is one)."""

    discovery: Discovery
    settings: Settings
    worker: str

    @property
    def runtime(self) -> Runtime: ...

    def engine(self, engine_id: str, device: str | None = None) -> LocalEngine: ...


def replicated_model(
    service: DeployingHost,
    deployment: Deployment,
    model: str | None,
    dtype: str | None,
    variant: str | None,
    options: Mapping[str, object],
) -> ReplicatedModel:
    """A handle whose replicas run in worker processes (started on its first request)."""
    from mizuoto_sdk.serving.handle import ReplicatedModel
    from mizuoto_sdk.serving.processes import WorkerSpec
    from mizuoto_sdk.serving.workers import ProcessReplica

    engine_id = deployment.engine_id
    discovery, settings = service.discovery, service.settings
    manifest = discovery.manifest(engine_id)
    if discovery.in_process(engine_id):
        raise InvalidRequest(
            f"engine {engine_id!r} is registered in this process (Discovery(plugins=...)), "
            "which a worker process cannot import: install it as a distribution, or set "
            f"engines.{engine_id}.deployment = inline",
            {"field": f"engines.{engine_id}.deployment", "engine": engine_id},
        )
    entry = manifest.model(model or settings.engine(engine_id, "model"))
    values = settings.as_dict()
    config = {
        "engine": engine_id,
        "model": entry.id,
        "dtype": dtype,
        "variant": variant,
        "options": dict(options),
        "settings": {k: v for k, v in values.items() if k not in DEFAULTS or DEFAULTS[k] != v},
        "discovery": discovery.arguments(),
        "threads": deployment.threads or _threads(deployment),
        "layout": deployment.parallel.layout(),
        "backend": _backend(deployment),
        "stop_timeout": float(settings.get("host.stop_timeout")),
    }
    replicas = [
        ProcessReplica(
            index,
            [
                WorkerSpec(service.worker, {**config, "device": d}, d, index * len(devices) + rank)
                for rank, d in enumerate(devices)
            ],
            engine_id=engine_id,
            execution_timeout=deployment.execution_timeout,
            restart=deployment.restart,
            start_timeout=deployment.start_timeout,
            stop_timeout=float(settings.get("host.stop_timeout")),
        )
        for index, devices in enumerate(deployment.replicas)
    ]
    placed = sorted({d for devices in deployment.replicas for d in devices})
    return ReplicatedModel(f"{engine_id}/{entry.id}@{'+'.join(placed)}", manifest, replicas)


def remote_model(
    service: DeployingHost,
    deployment: Deployment,
    model: str | None,
    dtype: str | None,
    variant: str | None,
    options: Mapping[str, object],
) -> RemoteModel:
    """A handle on the agent ``deployment.host`` names (it connects on its first request)."""
    from mizuoto_sdk.remote.client import RemoteReplica
    from mizuoto_sdk.remote.hosts import RemoteHost
    from mizuoto_sdk.remote.model import RemoteModel

    engine_id, settings = deployment.engine_id, service.settings
    manifest = service.discovery.manifest(engine_id)
    split = remote_device(deployment.replicas[0][0])
    assert split is not None  # a remote deployment's device is <name>/<device>
    name, device = split
    fields = {
        field: settings.get(f"remote.hosts.{name}.{field}")
        for field in ("address", "token_file", "tls", "tls_ca")
    }
    for field in ("address", "token_file"):
        if fields[field] is None:
            key = f"remote.hosts.{name}.{field}"
            raise InvalidRequest(
                f"{key}: engines.{engine_id}.device names the agent {name!r}, whose {field} is "
                f"not set; set {key}",
                {"field": key, "engine": engine_id},
            )
    host = RemoteHost(
        name,
        str(fields["address"]),
        str(fields["token_file"]),
        tls=bool(fields["tls"]),
        tls_ca=None if fields["tls_ca"] is None else str(fields["tls_ca"]),
        heartbeat_timeout=float(settings.get("remote.heartbeat_timeout")),
        load_timeout=float(settings.get("remote.load_timeout")),
        stop_timeout=float(settings.get("host.stop_timeout")),
    )
    entry = manifest.model(model or settings.engine(engine_id, "model"))
    load = {"model": entry.id, "dtype": dtype, "variant": variant, "options": dict(options)}
    replica = RemoteReplica(host, engine_id=engine_id, device=device, load=load)
    label = f"{engine_id}/{entry.id}@{deployment.replicas[0][0]}"
    return RemoteModel(label, manifest, replica, staged_folder)


def external_model(
    service: DeployingHost,
    deployment: Deployment,
    model: str | None,
    dtype: str | None,
    variant: str | None,
    options: Mapping[str, object],
) -> ExternalModel:
    """This process as one rank of the model, its rank the launcher's: it joins the launcher's
    world (``env://``), takes its device (``devices`` by rank, wrapping around: list one node's
    devices), and loads its part of the model."""
    from mizuoto_runtime.parallel import Groups
    from mizuoto_sdk.host.external import ExternalModel

    groups = Groups.start(
        deployment.parallel.layout(), None, init_method="env://", backend=_backend(deployment)
    )
    devices = deployment.replicas[0]
    device = devices[groups.rank("world") % len(devices)]
    bind_process(device, deployment.threads)
    service.runtime.parallel = groups
    try:
        local = service.engine(deployment.engine_id, device).load(
            model, dtype=dtype, variant=variant, options=options
        )
    except BaseException:
        groups.close()
        raise
    return ExternalModel(local, groups)


def _backend(deployment: Deployment) -> str:
    """NCCL between CUDA devices, gloo otherwise (CPU)."""
    kinds = {device_type(d) for devices in deployment.replicas for d in devices}
    return "nccl" if kinds == {"cuda"} else "gloo"


def _threads(deployment: Deployment) -> int | None:
    """A worker's torch thread count when ``engines.<id>.threads`` is unset.

    A replica of one rank: this process's count if torch is imported, else None (the worker
    keeps torch's default, which is what this process would get), so its output equals inline.
    A replica of several ranks on the CPU has no inline output to equal, and its ranks wait on
    each other at every collective, so they share the cores: cores / workers, at least 1.
    """
    workers = sum(len(devices) for devices in deployment.replicas)
    if deployment.parallel.ranks > 1 and _backend(deployment) == "gloo":
        return max(1, (os.cpu_count() or 1) // workers)
    torch = sys.modules.get("torch")
    return None if torch is None else int(torch.get_num_threads())
