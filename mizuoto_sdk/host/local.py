"""An engine on one device in this process: imports it, loads and unloads its models."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import warnings
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.devices.device import is_oom
from mizuoto_runtime.devices.probe import device_missing, torch_build
from mizuoto_sdk.discovery import Discovery
from mizuoto_sdk.engine import Engine, LoadedEngine
from mizuoto_sdk.errors import (
    ComputeUnavailable,
    EngineError,
    EngineUnavailable,
    InvalidRequest,
)
from mizuoto_sdk.host.failures import engine_failure
from mizuoto_sdk.host.loading import model_dir, model_handles
from mizuoto_sdk.host.model import LocalModel
from mizuoto_sdk.host.models import local_folder, model_cache
from mizuoto_sdk.host.notorch import NoRuntime, declared_dtype
from mizuoto_sdk.host.programs import missing_requirements, unavailable
from mizuoto_sdk.host.settings import Settings
from mizuoto_sdk.host.stopping import OpenCalls
from mizuoto_sdk.manifest import EngineManifest, ModelEntry, device_type
from mizuoto_sdk.types import LoadSpec

if TYPE_CHECKING:
    from mizuoto_runtime.devices.dtypes import DtypeChoice
    from mizuoto_runtime.runtime import Runtime

State = Literal["stopped", "ready", "busy", "crashed"]


class EngineHost(Protocol):
    """What a LocalEngine needs from the host that made it (``RuntimeService`` is one)."""

    discovery: Discovery
    settings: Settings
    registry_lock: threading.RLock
    open_calls: OpenCalls

    @property
    def runtime(self) -> Runtime: ...

    @property
    def started_runtime(self) -> Runtime | None: ...

    def make_room(self) -> list[str]: ...

    def release_idle(self, device: str, keep: LocalModel | None = None) -> list[str]: ...


class LocalEngine:
    """One engine on one device: imports the implementation on first use, loads its models."""

    def __init__(self, host: EngineHost, engine_id: str, device: str) -> None:
        self.host = host
        self.engine_id = engine_id
        self.device = device
        self.manifest: EngineManifest = host.discovery.manifest(engine_id)
        try:
            kind = device_type(device)
        except (TypeError, ValueError) as error:
            raise InvalidRequest(str(error), {"field": "device", "engine": engine_id}) from None
        if kind not in self.manifest.devices:
            raise InvalidRequest(
                f"device: engine {engine_id!r} runs on {', '.join(self.manifest.devices)}, "
                f"not {device!r}",
                {"field": "device", "engine": engine_id},
            )
        self.error: str | None = None
        self._engine: Engine | None = None
        self._handles: dict[tuple[object, ...], LocalModel] = {}  # the loaded ones
        self._known: weakref.WeakValueDictionary[tuple[object, ...], LocalModel] = (
            weakref.WeakValueDictionary()
        )
        # One lock for every engine of the host: loading here may unload models elsewhere.
        self._lock = host.registry_lock

    @property
    def state(self) -> State:
        if self.error is not None:
            return "crashed"
        handles = list(self._handles.values())
        if any(h.busy for h in handles):
            return "busy"
        return "ready" if handles else "stopped"

    @property
    def models(self) -> list[LocalModel]:
        """The models of this engine that are loaded now."""
        return list(self._handles.values())

    @property
    def handles(self) -> list[LocalModel]:
        """Deprecated: ``models``."""
        warnings.warn(
            "LocalEngine.handles is deprecated; use models", DeprecationWarning, stacklevel=2
        )
        return self.models

    @property
    def service(self) -> Any:
        """Deprecated: ``host``."""
        warnings.warn(
            "LocalEngine.service is deprecated; use host", DeprecationWarning, stacklevel=2
        )
        return self.host

    @property
    def settings(self) -> Settings:
        return self.host.settings

    @property
    def open_calls(self) -> OpenCalls:
        """The host's calls in flight, which this engine's calls join while they run."""
        return self.host.open_calls

    def runtime_for_calls(self) -> Runtime | None:
        """The runtime a call runs with; None for an engine that declares uses_torch=False."""
        return self.host.runtime if self.manifest.uses_torch else None

    def failure(self, error: BaseException, keep: LocalModel | None = None) -> EngineError:
        """The coded error for ``error`` from this engine (``failures.engine_failure``).

        Out of memory first releases the idle models on this device, all but ``keep``.
        """
        released = self.host.release_idle(self.device, keep=keep) if is_oom(error) else []
        return engine_failure(error, self.engine_id, self.device, released)

    def start(self) -> Engine:
        """Import the implementation (torch stays unimported until ``load``)."""
        if self._engine is None:
            engine_class = self._engine_class()
            missing = missing_requirements(self.manifest)
            if missing:  # not a crash: installing the program and loading again works
                raise self.failure(unavailable(self.engine_id, missing))
            try:
                self._engine = engine_class()
            except KeyboardInterrupt:
                raise
            except BaseException as error:  # a constructor that raises or exits
                self.error = f"{engine_class.__name__}() failed: {type(error).__name__}: {error}"
                raise self.failure(
                    EngineUnavailable(
                        f"{self.engine_id}: {self.error}",
                        {"reason": "constructor_failed", "exception": type(error).__name__},
                    )
                ) from error
            self.error = None
        return self._engine

    def _engine_class(self) -> type[Engine]:
        try:
            return self.host.discovery.get_engine(self.engine_id)
        except EngineError as error:
            self.error = str(error)
            raise self.failure(error) from None

    def load(
        self,
        model: str | None = None,
        *,
        dtype: str | None = None,
        variant: str | None = None,
        options: Mapping[str, object] | None = None,
    ) -> LocalModel:
        """The loaded model, loading it if needed (after making room under the resident limit)."""
        settings = self.host.settings
        entry = self._entry(model or settings.engine(self.engine_id, "model"))
        local = local_folder(settings, self.manifest, entry)
        variant = variant or settings.engine(self.engine_id, "variant")
        merged = {**settings.engine(self.engine_id, "options", {}), **(options or {})}
        with self._lock:
            self.start()
            choice = self._dtype(dtype or settings.engine(self.engine_id, "dtype"))
            key = (
                entry.id,
                variant,
                choice.dtype,
                json.dumps(merged, sort_keys=True, default=repr),
                local,  # engines.<id>.model_dir: another folder is another model
            )
            # One LocalModel per key for as long as anyone holds it: a caller's unloaded
            # handle and a new load of the same model are the same object.
            handle = self._handles.get(key) or self._known.get(key)
            if handle is None or handle.closed:
                spec = LoadSpec(
                    entry.id,
                    self.device,
                    choice.dtype,
                    model_dir(entry, self.engine_id, model_cache(settings), local),
                    variant,
                    merged,
                )
                handle = LocalModel(self, spec, key, list(choice.reasons))
                self._known[key] = handle
            if handle.loaded_engine is None:
                self.reload(handle)
            handle.last_used = time.monotonic()
            return handle

    def reload(self, handle: LocalModel) -> None:
        """Load ``handle``'s model (after making room under the resident limit), if it is not."""
        with self._lock:
            if handle.loaded_engine is not None:
                return
            engine, runtime = self.start(), self._runtime()
            self.host.make_room()
            ctx = RequestContext(
                seed=0,
                settings=self.host.settings.as_dict(),
                parallel=runtime.parallel if self.manifest.uses_torch else None,
            )
            started = time.perf_counter()
            loaded = None
            try:
                with ctx.bind():
                    # a uses_torch=False engine gets a NoRuntime, and declares that it never uses it
                    loaded = engine.load(handle.spec, runtime, ctx)  # type: ignore[arg-type]  # NoRuntime
                if not isinstance(loaded, LoadedEngine):
                    raise TypeError(
                        f"{type(engine).__name__}.load returned {type(loaded).__name__}"
                        ", expected a mizuoto_sdk.LoadedEngine"
                    )
                components = model_handles(
                    loaded, self.engine_id, self.manifest.uses_torch, handle.spec
                )
                description = dict(loaded.describe())
                if self.manifest.uses_torch:
                    runtime.manager.register(components, owner=handle.owner)
            except KeyboardInterrupt:
                raise
            except BaseException as error:  # sys.exit in engine code must not end the host
                if isinstance(loaded, LoadedEngine):
                    # Loaded but not usable: give back what it holds; its own error wins.
                    with contextlib.suppress(Exception):
                        loaded.unload()
                mapped = self.failure(error)
                if mapped is error:
                    raise
                raise mapped from error
            description.setdefault("load_seconds", time.perf_counter() - started)
            description.setdefault("dtype_reasons", list(handle._reasons))
            handle.loaded_engine, handle.model_handles = loaded, components
            handle.description, handle.stale = description, False
            self._handles[handle.key] = handle

    def begin_call(self, handle: LocalModel) -> LoadedEngine:
        """See ``LocalModel.begin_call``; under the lock that unloading takes, so a model is
        never unloaded between the check that it is loaded and the call's start."""
        with self._lock:
            self.reload(handle)
            handle._active += 1
            assert handle.loaded_engine is not None
            return handle.loaded_engine

    def end_call(self, handle: LocalModel) -> None:
        with self._lock:
            handle._active -= 1
            handle.last_used = time.monotonic()
            if handle.stale and handle._active == 0:
                self.unload(handle)

    def forget(self, handle: LocalModel) -> None:
        """A closed handle: the next ``load`` of its model makes a new one."""
        with self._lock:
            if self._known.get(handle.key) is handle:
                del self._known[handle.key]

    def unload(self, handle: LocalModel | None = None) -> list[str]:
        """Unload one handle, or every idle one; busy handles unload when their call ends."""
        with self._lock:
            targets = [handle] if handle is not None else list(self._handles.values())
            unloaded = []
            for target in targets:
                if target.busy:
                    target.stale = True
                    continue
                runtime = self.host.started_runtime
                if self._handles.pop(target.key, None) is not None:
                    if runtime is not None:
                        runtime.manager.forget(target.owner)
                    loaded, target.loaded_engine, target.model_handles = (
                        target.loaded_engine,
                        None,
                        (),
                    )
                    target.stale = False
                    if loaded is not None:
                        loaded.unload()
                    unloaded.append(target.name)
        return unloaded

    def _entry(self, model: str | None) -> ModelEntry:
        try:
            return self.manifest.model(model)
        except EngineError as error:
            raise self.failure(error) from None

    def _runtime(self) -> Runtime | NoRuntime:
        """The process's runtime (created now if needed); a stand-in for a torch-free engine."""
        if not self.manifest.uses_torch:
            return NoRuntime(self.engine_id)
        try:
            runtime = self.host.runtime
        except EngineError as error:  # torch is not installed
            raise self.failure(error) from None
        if not runtime.device_available(self.device):
            cause, why = device_missing(self.device, torch_build())
            raise self.failure(
                ComputeUnavailable(
                    f"device {self.device} is not available: {why}",
                    {"reason": "device_missing", "cause": cause, "torch": runtime.torch_version},
                )
            )
        return runtime

    def _dtype(self, requested: str | None) -> DtypeChoice:
        try:
            if not self.manifest.uses_torch:  # no device to ask: the manifest's order decides
                from mizuoto_runtime.devices.dtypes import DtypeChoice

                return DtypeChoice(declared_dtype(requested, self.manifest.dtypes))
            runtime = self._runtime()
            return runtime.devices.pick_dtype(self.device, requested, self.manifest.dtypes)
        except EngineError as error:
            raise self.failure(error) from None


def __getattr__(name: str) -> object:
    if name == "LocalHandle":  # renamed: "handle" names a ModelHandle only
        warnings.warn(
            "LocalHandle is deprecated; use LocalModel (mizuoto_sdk.host.LocalModel)",
            DeprecationWarning,
            stacklevel=2,
        )
        return LocalModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
