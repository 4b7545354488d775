"""The host side of the runtime: which engines run where, and how many models stay resident."""

from __future__ import annotations

import json
import logging
import threading
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mizuoto_sdk.discovery import Discovery
from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.host.deploy import external_model, remote_model, replicated_model
from mizuoto_sdk.host.inventory import DoctorReport, EngineRow, doctor_report, engine_rows
from mizuoto_sdk.host.local import LocalEngine
from mizuoto_sdk.host.model import LocalModel
from mizuoto_sdk.host.notorch import torch_missing
from mizuoto_sdk.host.settings import Settings
from mizuoto_sdk.host.stopping import OpenCalls
from mizuoto_sdk.manifest import canonical_device, device_type
from mizuoto_sdk.parallel import ParallelConfig, check_declared
from mizuoto_sdk.serving.plan import DEPLOYMENT_FIELDS, Deployment, plan_deployment

if TYPE_CHECKING:
    from mizuoto_runtime.runtime import Runtime

log = logging.getLogger(__name__)

_BYTE_FIELDS = ("resident_bytes", "streamed_bytes", "host_bytes")
WORKER = "mizuoto_sdk.host.worker:serve"
"""The function a worker process of a local deployment runs (``host/worker.py``)."""

if TYPE_CHECKING:  # the handles of other deployments are imported when one is built
    from mizuoto_sdk.host.external import ExternalModel
    from mizuoto_sdk.serving.handle import ReplicatedModel

    ServedModel = LocalModel | ReplicatedModel | ExternalModel
"""What ``RuntimeService.load`` returns: the model in this process (``mode == "inline"``),
served by worker processes (``mode == "local"``), this process's rank of it under an external
launcher (``mode == "external"``), or on a ``mizuoto agent`` elsewhere (``mode == "remote"``, a
``RemoteModel``, which is a ``ReplicatedModel``); all answer the same calls."""
_COMPONENT_FIELDS = ("name", *_BYTE_FIELDS, "state")


class RuntimeService:
    """Creates LocalEngines on demand and keeps the resident models within the settings.

    The process's ``Runtime`` (and with it torch) is created on the first model load of an engine
    that uses torch, so a service that only lists engines, or runs only engines that declare
    ``uses_torch=False``, never imports torch. A model deployed to worker processes
    (``engines.<id>.replicas`` and friends) never imports torch here either.

    ``worker`` names the function (``"module:function"``) a worker process runs; a tool may name
    a wrapper of the default one. Use the service as a context manager, or ``close()`` it, to
    stop every worker.
    """

    def __init__(
        self,
        settings: Settings | Mapping[str, object] | None = None,
        discovery: Discovery | None = None,
        *,
        worker: str = WORKER,
    ) -> None:
        self.settings = settings if isinstance(settings, Settings) else Settings(settings)
        self.discovery = discovery if discovery is not None else Discovery()
        self.worker = worker
        self._engines: dict[tuple[str, str], LocalEngine] = {}
        self._served: dict[tuple[object, ...], ReplicatedModel] = {}
        self._external: dict[tuple[object, ...], ExternalModel] = {}
        self._runtime: Runtime | None = None
        self.registry_lock = threading.RLock()
        self.open_calls = OpenCalls()
        self.settings.subscribe(self._setting_changed)

    @property
    def runtime(self) -> Runtime:
        """The process's runtime, created (importing torch) on first use.

        Where torch is not installed this raises ComputeUnavailable (``reason: torch_missing``)
        with the command that installs it.
        """
        with self.registry_lock:
            if self._runtime is None:
                try:
                    from mizuoto_runtime.runtime import Runtime

                    self._runtime = Runtime(settings=self.settings)
                except ImportError as error:
                    missing = torch_missing(error)
                    if missing is None:
                        raise
                    raise missing from error
            return self._runtime

    @property
    def started_runtime(self) -> Runtime | None:
        """The runtime if an engine that uses torch has created it, else None (never creates it)."""
        return self._runtime

    def engine(self, engine_id: str, device: str | None = None) -> LocalEngine:
        """The LocalEngine for ``engine_id`` on ``device`` (default: its setting, else cpu);
        every spelling of one device (``cpu``, ``cpu:0``) is the same LocalEngine."""
        device = _device(engine_id, device or self.settings.engine(engine_id, "device") or "cpu")
        with self.registry_lock:
            engine = self._engines.get((engine_id, device))
            if engine is None:
                engine = LocalEngine(self, engine_id, device)
                self._engines[(engine_id, device)] = engine
            return engine

    def load(
        self,
        engine_id: str,
        model: str | None = None,
        *,
        device: str | None = None,
        dtype: str | None = None,
        variant: str | None = None,
        options: Mapping[str, object] | None = None,
    ) -> ServedModel:
        """``model`` of ``engine_id`` as its deployment settings place it.

        Inline (one replica of one rank, the default) it is loaded now, in this process. A local
        deployment returns a handle whose worker processes start on its first request, or on
        ``start()``. Either way the handle answers the same calls.
        """
        deployment = self.deployment(engine_id, device)
        if deployment.mode == "inline":
            return self.engine(engine_id, deployment.replicas[0][0]).load(
                model, dtype=dtype, variant=variant, options=options
            )
        key = (
            deployment,
            model,
            dtype,
            variant,
            json.dumps(options or {}, sort_keys=True, default=repr),
        )
        with self.registry_lock:
            if deployment.mode == "external":
                external = self._external.get(key)
                if external is None or external.closed:
                    external = external_model(
                        self, deployment, model, dtype, variant, options or {}
                    )
                    self._external[key] = external
                return external
            served = self._served.get(key)
            if served is None or served.closed:
                build = remote_model if deployment.mode == "remote" else replicated_model
                served = build(self, deployment, model, dtype, variant, options or {})
                self._served[key] = served
            return served

    def deployment(self, engine_id: str, device: str | None = None) -> Deployment:
        """Where ``engine_id``'s models run, from its settings, checked before any worker starts."""
        manifest = self.discovery.manifest(engine_id)
        fields = {name: self.settings.engine(engine_id, name) for name in DEPLOYMENT_FIELDS}
        device = device or self.settings.engine(engine_id, "device") or "cpu"
        if not (isinstance(device, str) and "/" in device):  # an agent reads its own devices
            device = _device(engine_id, device)
        parallel = ParallelConfig.from_mapping(
            self.settings.engine(engine_id, "parallel"), f"engines.{engine_id}.parallel"
        )
        check_declared(manifest, parallel)
        if parallel.ranks > 1:  # the engine's own limits; its class imports without torch
            self.discovery.get_engine(engine_id).validate_parallel(parallel, parallel.ranks)
        return plan_deployment(engine_id, fields, manifest.devices, device, parallel)

    def served(self) -> list[ReplicatedModel]:
        """The models served by worker processes (open ones)."""
        with self.registry_lock:
            return [s for s in self._served.values() if not s.closed]

    def close(self, grace: float | None = None) -> list[str]:
        """Stop every call in flight, every worker process, and unload every model; idempotent.

        The calls running in this process are cancelled (a stream paused between chunks has its
        engine generator closed), and the service waits up to ``grace`` seconds (default: the
        setting ``host.stop_timeout``) for them to unwind: their ``finally`` blocks run and the
        children they started with ``ctx.open_process`` are killed. Workers are then told to
        stop, which they do the same way; requests in flight on them fail with
        ``engine_unavailable``; queued submissions are cancelled. Returns the names of the
        models whose calls had not unwound in time (they are left to the process's exit).
        """
        if grace is None:
            grace = float(self.settings.get("host.stop_timeout"))
        left = self.open_calls.stop(grace)
        if left:
            log.warning("calls still running after %.1f s of stopping: %s", grace, ", ".join(left))
        with self.registry_lock:
            served, self._served = list(self._served.values()), {}
            external, self._external = list(self._external.values()), {}
        for replicated in served:
            replicated.close()
        for rank in external:
            rank.close()
        for model in self.models():
            model.close()
        return left

    def __enter__(self) -> RuntimeService:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def loaded(self, *args: Any, **kwargs: Any) -> ServedModel:
        """Deprecated: ``load``."""
        warnings.warn(
            "RuntimeService.loaded is deprecated; use load", DeprecationWarning, stacklevel=2
        )
        return self.load(*args, **kwargs)

    def describe_engines(self) -> list[EngineRow]:
        """Every engine found, failed plugins included: what ``mizuoto engines --json`` prints."""
        return engine_rows(self.discovery)

    def doctor(self, engine_id: str | None = None) -> DoctorReport:
        """The installed torch build against this machine, and whether each engine (or the one
        named) can run here: what ``mizuoto doctor --json`` prints."""
        return doctor_report(self.discovery, engine_id)

    def engines(self) -> list[LocalEngine]:
        with self.registry_lock:
            return list(self._engines.values())

    def models(self) -> list[LocalModel]:
        """Every model loaded now, of every engine."""
        return [m for engine in self.engines() for m in engine.models]

    def handles(self) -> list[LocalModel]:
        """Deprecated: ``models``."""
        warnings.warn(
            "RuntimeService.handles is deprecated; use models", DeprecationWarning, stacklevel=2
        )
        return self.models()

    def loaded_models(self) -> list[dict[str, object]]:
        """Deprecated: ``describe_models``."""
        warnings.warn(
            "RuntimeService.loaded_models is deprecated; use describe_models",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.describe_models()

    def describe_models(self) -> list[dict[str, Any]]:
        """What ``mizuoto runtime`` shows: each loaded model, where its weights are, busy or idle.

        ``components`` are the model's ModelHandles as the memory manager sees them; the byte
        totals add them up (resident on the device, streamed in as layers run, parked in host
        memory). An engine that declares no handles shows none and zero bytes.
        """
        rows = [] if self._runtime is None else self._runtime.manager.residency()
        models: list[dict[str, Any]] = [self._describe_served(s) for s in self.served()]
        for h in self.models():
            components: list[dict[str, Any]] = [
                {key: row[key] for key in _COMPONENT_FIELDS}
                for row in rows
                if row["owner"] == h.owner
            ]
            models.append(
                {
                    "name": h.name,
                    "owner": h.owner,
                    "engine": h.engine.engine_id,
                    "model": h.spec.model_id,
                    "device": h.spec.device,
                    "dtype": h.spec.dtype,
                    "state": "busy" if h.busy else "idle",
                    "pinned": self._pinned(h),
                    **{key: sum(c[key] for c in components) for key in _BYTE_FIELDS},
                    "components": components,
                    "description": h.description,
                    "mode": h.mode,
                    "replicas": [r.as_dict() for r in h.replicas],
                }
            )
        return models

    def _describe_served(self, model: ReplicatedModel) -> dict[str, Any]:
        replicas = model.replicas
        return {
            "name": model.name,
            "owner": model.name,
            "engine": model.manifest.id,
            "model": model.name.split("/", 1)[1].rsplit("@", 1)[0],
            "device": "+".join(sorted({d for r in replicas for d in r.devices})),
            "dtype": model.dtype,
            "state": "busy" if model.busy else "idle",
            "pinned": bool(self.settings.engine(model.manifest.id, "pinned", False)),
            **dict.fromkeys(_BYTE_FIELDS, 0),  # the workers' memory is theirs to report
            "components": [],
            "description": model.description,
            "mode": model.mode,
            "replicas": [r.as_dict() for r in replicas],
            **({"host": getattr(model, "host", None)} if model.mode == "remote" else {}),
        }

    def make_room(self) -> list[str]:
        """Unload least-recently-used idle, unpinned models until one more fits the limit."""
        limit = self.settings.compute.max_resident_models
        unloaded: list[str] = []
        if limit is None:
            return unloaded
        with self.registry_lock:
            handles = self.models()
            candidates = sorted(
                (h for h in handles if not h.busy and not self._pinned(h)),
                key=lambda h: h.last_used,
            )
            excess = len(handles) - limit + 1
            for handle in candidates[: max(excess, 0)]:
                unloaded += handle.engine.unload(handle)
            if len(handles) - len(unloaded) >= limit:
                log.warning(
                    "%d models resident (limit %d): the rest are busy or pinned",
                    len(handles) - len(unloaded),
                    limit,
                )
        return unloaded

    def release_idle(self, device: str, keep: LocalModel | None = None) -> list[str]:
        """Give back ``device``'s memory held by idle models (after an out-of-memory error).

        Components the memory manager tracks move to host memory and stay loaded (the next call
        places them again); an idle model that declares no handles is unloaded, as the manager
        cannot move it. ``keep`` (the model whose call failed) and pinned models are spared
        the unload.
        """
        released: list[str] = []
        if self._runtime is not None:
            spared = keep.model_handles if keep is not None else ()
            released += self._runtime.manager.release_idle(device, keep=spared)
        for engine in self.engines():
            if engine.device != device:
                continue
            for handle in engine.models:
                if handle is keep or handle.busy or handle.model_handles or self._pinned(handle):
                    continue
                released += engine.unload(handle)
        if self._runtime is not None and device_type(device) != "cpu":
            self._runtime.release(device)
        return released

    def release_after_oom(self) -> list[str]:
        """``release_idle`` on every device whose memory is scarce; CPU models stay as they are."""
        if self._runtime is None:
            return []
        devices = self._runtime.devices
        scarce = sorted({e.device for e in self.engines() if devices.is_accelerator(e.device)})
        return [name for device in scarce for name in self.release_idle(device)]

    def unload(self, engine_id: str | None = None) -> list[str]:
        """Unload the idle models of one engine, or of all; busy ones go when their call ends.

        ``engine_id`` may also name models as ``mizuoto runtime`` lists them
        (``"codeclm/tiny@cpu"``: every dtype and options of it), or one model by its owner
        (``"codeclm/tiny@cpu[float32]"``). An idle model served by worker processes stops its
        workers (the next ``load`` starts new ones); a busy one keeps them.
        """
        served = [
            s for s in self.served() if engine_id in (None, s.name, s.manifest.id) and not s.busy
        ]
        for model in served:  # workers stop; the next load starts them again
            model.close()
        named = [h for h in self.models() if engine_id in (h.name, h.owner)]
        if named:
            return [s.name for s in served] + [n for h in named for n in h.engine.unload(h)]
        return [s.name for s in served] + [
            name
            for engine in self.engines()
            if engine_id in (None, engine.engine_id)
            for name in engine.unload()
        ]

    def _pinned(self, handle: LocalModel) -> bool:
        return bool(self.settings.engine(handle.engine.engine_id, "pinned", False))

    def _setting_changed(self, key: str, value: object) -> None:
        parts = key.split(".")
        if parts[:2] == ["remote", "hosts"]:  # the next load connects with the new value
            with self.registry_lock:
                closing: list[ReplicatedModel] = [
                    s
                    for s in self._served.values()
                    if s.mode == "remote" and getattr(s, "host", None) == parts[2]
                ]
            for model in closing:
                model.close()
            return
        if parts[0] == "engines" and parts[2] != "pinned":
            # The next load starts a model with the new value; the old one takes no new request
            # and closes once those in flight (begun on the old value) have finished. It stays
            # listed, under a key no load asks for, until then, so that close() still stops it.
            with self.registry_lock:
                retiring = [s for s in self._served.values() if s.manifest.id == parts[1]]
                self._served = {
                    k: s for k, s in self._served.items() if s not in retiring and not s.closed
                } | {("retired", id(s)): s for s in retiring if not s.closed}
            for model in retiring:
                model.retire()
            unloaded = self.unload(parts[1])
            log.info("%s changed: unloaded %s", key, ", ".join(unloaded) or "nothing")


def _device(engine_id: str, device: object) -> str:
    """The one spelling of a device of this machine, or the caller's error naming the field."""
    try:
        return canonical_device(device)  # type: ignore[arg-type]  # TypeError for a non-string
    except (TypeError, ValueError) as error:
        raise InvalidRequest(str(error), {"field": "device", "engine": engine_id}) from None
