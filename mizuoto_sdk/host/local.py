"""An engine on one device in this process (LocalEngine) and its loaded models (LocalHandle)."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import shutil
import time
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from mizuoto_runtime.context import RequestContext
from mizuoto_sdk.engine import Engine, LoadedEngine
from mizuoto_sdk.errors import (
    ComputeUnavailable,
    EngineError,
    EngineUnavailable,
    InvalidRequest,
    Unsupported,
)
from mizuoto_sdk.host.calls import Call, map_error
from mizuoto_sdk.host.notorch import NoRuntime, declared_dtype
from mizuoto_sdk.host.paths import staged_folder
from mizuoto_sdk.host.request import EngineRequest
from mizuoto_sdk.manifest import EngineManifest, ModelEntry, device_type
from mizuoto_sdk.types import AudioChunk, LoadSpec

if TYPE_CHECKING:
    from mizuoto_runtime.devices.dtypes import DtypeChoice
    from mizuoto_runtime.memory.handle import ModelHandle
    from mizuoto_runtime.runtime import Runtime
    from mizuoto_sdk.host.service import RuntimeService

State = Literal["stopped", "ready", "busy", "crashed"]


class LocalHandle:
    """A model of an engine, answering the engine's capabilities through the host's calls.

    A handle stays usable for as long as the caller keeps it: the host may unload the model
    while no call runs on it (``compute.max_resident_models``, a changed setting, ``unload``),
    and the next call on the handle loads it again, with the same spec, before it begins. A
    call in progress keeps its model loaded until it ends.
    """

    def __init__(
        self, engine: LocalEngine, spec: LoadSpec, key: tuple[object, ...], reasons: list[str]
    ) -> None:
        self.engine = engine
        self.spec = spec
        self.key = key
        self.name = f"{engine.engine_id}/{spec.model_id}@{spec.device}"
        # What the memory manager files the model's components under: one owner per loaded
        # model, so loads that differ only in dtype, variant or options never share one.
        self.owner = _owner(self.name, key)
        self.loaded: LoadedEngine | None = None
        self.model_handles: tuple[ModelHandle, ...] = ()
        self.description: dict[str, object] = {}
        self.last_used = time.monotonic()
        self.stale = False
        self._reasons = reasons
        self._active = 0

    @property
    def busy(self) -> bool:
        return self._active > 0

    @property
    def handles(self) -> tuple[ModelHandle, ...]:
        """The model's components as the memory manager tracks them (see ``_model_handles``)."""
        return self.model_handles

    def begin_call(self) -> LoadedEngine:
        """Mark a call as running (the model is then never unloaded) and return the loaded
        engine it runs on, loading the model again first if it was unloaded meanwhile."""
        return self.engine.begin_call(self)

    def end_call(self) -> None:
        self.engine.end_call(self)

    def synthesize(self, text: str, request: EngineRequest | None = None) -> Iterator[AudioChunk]:
        """A lazy stream of float32 mono chunks; close it to stop the engine early."""
        call = self._call("synthesize", request)
        return call.stream("synthesize", self._text(text), call.ctx.params)

    def convert(
        self, audio: AudioChunk, request: EngineRequest | None = None
    ) -> Iterator[AudioChunk]:
        call = self._call("convert", request)
        return call.stream("convert", self._audio(audio), call.ctx.params)

    def edit(
        self, audio: AudioChunk, text: str, request: EngineRequest | None = None
    ) -> Iterator[AudioChunk]:
        call = self._call("edit", request)
        return call.stream("edit", self._audio(audio), self._text(text), call.ctx.params)

    def prepare_voice(
        self, audio: AudioChunk, voice_dir: str | Path, request: EngineRequest | None = None
    ) -> dict[str, object]:
        """Let the engine write a voice into ``voice_dir``, which appears only if it succeeds."""
        call = self._call("prepare_voice", request)
        audio = self._audio(audio)
        try:  # before the engine runs: a target that cannot take the result is the caller's
            target, staging = staged_folder(Path(voice_dir), "voice_dir")
        except InvalidRequest as error:
            raise map_error(error, self.engine) from None
        try:
            result = call.run("prepare_voice", audio, staging, call.ctx.params)
            with contextlib.suppress(FileNotFoundError):
                target.rmdir()
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return dict(result or {})

    def call(
        self,
        op: str,
        payload: Mapping[str, object] | None = None,
        request: EngineRequest | None = None,
    ) -> object:
        call = self._call("call", request)
        if not isinstance(op, str) or not op:
            raise self._invalid("op", f"expected an operation name, got {op!r}")
        return call.run("call", op, dict(payload or {}))

    def _call(self, capability: str, request: EngineRequest | None) -> Call:
        manifest = self.engine.manifest
        if capability not in manifest.capabilities:
            raise map_error(
                Unsupported(
                    f"engine {manifest.id!r} does not support {capability}; it supports "
                    f"{', '.join(manifest.capabilities)}",
                    {"capability": capability},
                ),
                self.engine,
            )
        request = request if request is not None else EngineRequest()
        try:  # before any model loads: a bad param is the caller's mistake, named as such
            params = manifest.check_params(request.params)
        except EngineError as error:
            raise map_error(error, self.engine) from None
        if self.loaded is None:  # unloaded while idle: load it again (calls do as they begin)
            self.engine.reload(self)
        try:
            return Call(self, request, capability, params)
        except EngineError as error:
            raise map_error(error, self.engine) from None

    def _invalid(self, field: str, message: str) -> EngineError:
        return map_error(InvalidRequest(f"{field}: {message}", {"field": field}), self.engine)

    def _text(self, text: object) -> str:
        if not isinstance(text, str):
            raise self._invalid("text", f"expected a string, got {type(text).__name__}")
        if not text.strip():
            raise self._invalid("text", "is empty")
        return text

    def _audio(self, audio: object) -> AudioChunk:
        if not isinstance(audio, AudioChunk):
            raise self._invalid("audio", f"expected an AudioChunk, got {type(audio).__name__}")
        return audio

    def collect(
        self, capability: str, *arguments: object, request: EngineRequest | None = None
    ) -> AudioChunk:
        """The whole output of a streaming capability as one chunk, computed in one step
        (``collect("synthesize", text)``); see ``mizuoto_sdk.host.collect``."""
        from mizuoto_sdk.host.collect import collect

        return collect(self, capability, arguments, request)


class LocalEngine:
    """One engine on one device: imports the implementation on first use, loads its models."""

    def __init__(self, service: RuntimeService, engine_id: str, device: str) -> None:
        self.service = service
        self.engine_id = engine_id
        self.device = device
        self.manifest: EngineManifest = service.discovery.manifest(engine_id)
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
        self._handles: dict[tuple[object, ...], LocalHandle] = {}  # the loaded ones
        self._known: weakref.WeakValueDictionary[tuple[object, ...], LocalHandle] = (
            weakref.WeakValueDictionary()
        )
        # One lock for every engine of the service: loading here may unload models elsewhere.
        self._lock = service.registry_lock

    @property
    def state(self) -> State:
        if self.error is not None:
            return "crashed"
        handles = list(self._handles.values())
        if any(h.busy for h in handles):
            return "busy"
        return "ready" if handles else "stopped"

    @property
    def handles(self) -> list[LocalHandle]:
        return list(self._handles.values())

    def start(self) -> Engine:
        """Import the implementation (torch stays unimported until ``load``)."""
        if self._engine is None:
            engine_class = self._engine_class()
            try:
                self._engine = engine_class()
            except KeyboardInterrupt:
                raise
            except BaseException as error:  # a constructor that raises or exits
                self.error = f"{engine_class.__name__}() failed: {type(error).__name__}: {error}"
                raise map_error(
                    EngineUnavailable(
                        f"{self.engine_id}: {self.error}",
                        {"reason": "constructor_failed", "exception": type(error).__name__},
                    ),
                    self,
                ) from error
            self.error = None
        return self._engine

    def _engine_class(self) -> type[Engine]:
        try:
            return self.service.discovery.get_engine(self.engine_id)
        except EngineError as error:
            self.error = str(error)
            raise map_error(error, self) from None

    def load(
        self,
        model: str | None = None,
        *,
        dtype: str | None = None,
        variant: str | None = None,
        options: Mapping[str, object] | None = None,
    ) -> LocalHandle:
        """The loaded model, loading it if needed (after making room under the resident limit)."""
        settings = self.service.settings
        entry = self._entry(model or settings.engine(self.engine_id, "model"))
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
            )
            # One LocalHandle per key for as long as anyone holds it: a caller's unloaded
            # handle and a new load of the same model are the same object.
            handle = self._handles.get(key) or self._known.get(key)
            if handle is None:
                spec = LoadSpec(
                    entry.id,
                    self.device,
                    choice.dtype,
                    _model_dir(entry, self.engine_id),
                    variant,
                    merged,
                )
                handle = LocalHandle(self, spec, key, list(choice.reasons))
                self._known[key] = handle
            if handle.loaded is None:
                self.reload(handle)
            handle.last_used = time.monotonic()
            return handle

    def reload(self, handle: LocalHandle) -> None:
        """Load ``handle``'s model (after making room under the resident limit), if it is not."""
        with self._lock:
            if handle.loaded is not None:
                return
            engine, runtime = self.start(), self._runtime()
            self.service.make_room()
            ctx = RequestContext(seed=0, settings=self.service.settings.as_dict())
            started = time.perf_counter()
            loaded = None
            try:
                with ctx.bind():
                    loaded = engine.load(handle.spec, runtime, ctx)
                if not isinstance(loaded, LoadedEngine):
                    raise TypeError(
                        f"{type(engine).__name__}.load returned {type(loaded).__name__}"
                        ", expected a mizuoto_sdk.LoadedEngine"
                    )
                components = _model_handles(loaded, self, handle.spec)
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
                mapped = map_error(error, self)
                if mapped is error:
                    raise
                raise mapped from error
            description.setdefault("load_seconds", time.perf_counter() - started)
            description.setdefault("dtype_reasons", list(handle._reasons))
            handle.loaded, handle.model_handles = loaded, components
            handle.description, handle.stale = description, False
            self._handles[handle.key] = handle

    def begin_call(self, handle: LocalHandle) -> LoadedEngine:
        """See ``LocalHandle.begin_call``; under the lock that unloading takes, so a model is
        never unloaded between the check that it is loaded and the call's start."""
        with self._lock:
            self.reload(handle)
            handle._active += 1
            assert handle.loaded is not None
            return handle.loaded

    def end_call(self, handle: LocalHandle) -> None:
        with self._lock:
            handle._active -= 1
            handle.last_used = time.monotonic()
            if handle.stale and handle._active == 0:
                self.unload(handle)

    def unload(self, handle: LocalHandle | None = None) -> list[str]:
        """Unload one handle, or every idle one; busy handles unload when their call ends."""
        with self._lock:
            targets = [handle] if handle is not None else list(self._handles.values())
            unloaded = []
            for target in targets:
                if target.busy:
                    target.stale = True
                    continue
                runtime = self.service.started_runtime
                if self._handles.pop(target.key, None) is not None:
                    if runtime is not None:
                        runtime.manager.forget(target.owner)
                    loaded, target.loaded, target.model_handles = target.loaded, None, ()
                    target.stale = False
                    if loaded is not None:
                        loaded.unload()
                    unloaded.append(target.name)
        return unloaded

    def _entry(self, model: str | None) -> ModelEntry:
        try:
            return self.manifest.model(model)
        except EngineError as error:
            raise map_error(error, self) from None

    def _runtime(self) -> Runtime | NoRuntime:
        """The process's runtime (created now if needed); a stand-in for a torch-free engine."""
        if not self.manifest.uses_torch:
            return NoRuntime(self.engine_id)
        try:
            runtime = self.service.runtime
        except EngineError as error:  # torch is not installed
            raise map_error(error, self) from None
        if not runtime.device_available(self.device):
            raise map_error(
                ComputeUnavailable(
                    f"device {self.device} is not available to this torch build "
                    f"({runtime.torch_version})",
                    {"reason": "device_missing"},
                ),
                self,
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
            raise map_error(error, self) from None


def _model_handles(
    loaded: LoadedEngine, engine: LocalEngine, spec: LoadSpec
) -> tuple[ModelHandle, ...]:
    """``loaded.handles`` as ModelHandles: a plain nn.Module is wrapped in one.

    A wrapped module keeps the device its weights are on (its load device), named
    ``<engine>/<model>:<class name>``; anything else in ``handles`` is an engine bug, and so is
    any handle of an engine that declares ``uses_torch=False``.
    """
    items = tuple(loaded.handles)
    if not items:
        return ()
    if not engine.manifest.uses_torch:
        raise TypeError(
            f"{type(loaded).__name__}.handles lists {len(items)} item(s), but engine "
            f"{engine.engine_id!r} declares uses_torch=False; declare uses_torch=True"
        )
    from torch import nn

    from mizuoto_runtime.memory.handle import ModelHandle

    handles: list[ModelHandle] = []
    for index, item in enumerate(items):
        if isinstance(item, ModelHandle):
            handles.append(item)
            continue
        if not isinstance(item, nn.Module):
            raise TypeError(
                f"{type(loaded).__name__}.handles[{index}] is {type(item).__name__}"
                ", expected a mizuoto_runtime.memory.handle.ModelHandle or a torch.nn.Module"
            )
        name = f"{engine.engine_id}/{spec.model_id}:{type(item).__name__}"
        if any(h.name == name for h in handles):
            name = f"{name}.{index}"
        tensor = next(itertools.chain(item.parameters(), item.buffers()), None)
        device = spec.device if tensor is None else str(tensor.device)
        handles.append(ModelHandle(item, name=name, load_device=device))
    return tuple(handles)


def _owner(name: str, key: tuple[object, ...]) -> str:
    """``name`` with what else tells one load of the model from another (dtype, variant,
    options): ``"codeclm/tiny@cpu[float32]"``, ``"codeclm/tiny@cpu[bfloat16 {"x": 1}]"``."""
    _, variant, dtype, options = key
    extra = [str(dtype)] + ([f"variant={variant}"] if variant else [])
    return f"{name}[{' '.join(extra + ([str(options)] if options != '{}' else []))}]"


def _model_dir(entry: ModelEntry, engine_id: str) -> Path | None:
    if entry.files is None:
        return None
    if entry.files.startswith("/"):
        return Path(entry.files)
    package, _, relative = entry.files.partition(":")
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise EngineUnavailable(
            f"model {entry.id!r} of {engine_id!r} lives in package {package!r}"
            ", which is not installed",
            {"engine": engine_id},
        )
    if spec.submodule_search_locations:
        base = Path(next(iter(spec.submodule_search_locations)))
    else:
        base = Path(str(spec.origin)).parent
    return base / relative
