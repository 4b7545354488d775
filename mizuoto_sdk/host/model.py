"""A loaded model of an engine (LocalModel): the host's calls on it, checked and coded.

A model keeps answering for as long as the caller holds it: the engine that owns it may unload it
while no call runs, and the next call loads it again, with the same spec, before it begins.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
import warnings
from collections.abc import Generator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from mizuoto_sdk.errors import EngineError, EngineUnavailable, InvalidRequest, Unsupported
from mizuoto_sdk.host.calls import Call
from mizuoto_sdk.host.loading import owner_name
from mizuoto_sdk.host.paths import staged_folder
from mizuoto_sdk.manifest import EngineManifest
from mizuoto_sdk.request import EngineRequest
from mizuoto_sdk.serving.inputs import checked_audio, checked_text, collected_inputs
from mizuoto_sdk.serving.routing import ReplicaStatus
from mizuoto_sdk.serving.submit import Submitter
from mizuoto_sdk.types import AudioChunk, LoadSpec

if TYPE_CHECKING:
    from mizuoto_runtime.memory.handle import ModelHandle
    from mizuoto_runtime.runtime import Runtime
    from mizuoto_sdk.engine import LoadedEngine
    from mizuoto_sdk.host.settings import Settings
    from mizuoto_sdk.host.stopping import OpenCalls


class ModelOwner(Protocol):
    """What a model needs from the engine that loaded it (``LocalEngine`` is one)."""

    engine_id: str
    manifest: EngineManifest

    @property
    def settings(self) -> Settings: ...

    def runtime_for_calls(self) -> Runtime | None: ...

    @property
    def open_calls(self) -> OpenCalls: ...

    def reload(self, model: LocalModel) -> None: ...

    def begin_call(self, model: LocalModel) -> LoadedEngine: ...

    def end_call(self, model: LocalModel) -> None: ...

    def failure(self, error: BaseException, keep: LocalModel | None = None) -> EngineError: ...

    # What the host and the contract suite ask of a model's engine through the model:

    @property
    def state(self) -> str: ...

    def unload(self, handle: LocalModel | None = None) -> list[str]: ...

    def forget(self, model: LocalModel) -> None: ...


class LocalModel:
    """A model of an engine, answering the engine's capabilities through the host's calls.

    A handle stays usable for as long as the caller keeps it: the host may unload the model
    while no call runs on it (``compute.max_resident_models``, a changed setting, ``unload``),
    and the next call on the handle loads it again, with the same spec, before it begins. A
    call in progress keeps its model loaded until it ends.

    It is the inline deployment of ``RuntimeService.load``: one replica, in this process, with
    the same calls as a model served by worker processes (``submit``, ``mode``, ``replicas``,
    ``start``, ``close``).
    """

    mode = "inline"

    def __init__(
        self, engine: ModelOwner, spec: LoadSpec, key: tuple[object, ...], reasons: list[str]
    ) -> None:
        self.engine = engine
        self.spec = spec
        self.key = key
        self.name = f"{engine.engine_id}/{spec.model_id}@{spec.device}"
        # What the memory manager files the model's components under: one owner per loaded
        # model, so loads that differ only in dtype, variant or options never share one.
        self.owner = owner_name(self.name, key)
        self.loaded_engine: LoadedEngine | None = None
        self.model_handles: tuple[ModelHandle, ...] = ()
        self.description: dict[str, object] = {}
        self.last_used = time.monotonic()
        self.stale = False
        self._reasons = reasons
        self._active = 0
        self.closed = False
        limit = engine.manifest.max_concurrency  # calls at once; the rest queue for a turn
        self._turns = threading.BoundedSemaphore(limit) if limit is not None else None
        # submit runs calls one at a time, in order, on one thread of the model
        self._submitter = Submitter(self, workers=1, name=self.name)

    @property
    def busy(self) -> bool:
        return self._active > 0

    @property
    def handles(self) -> tuple[ModelHandle, ...]:
        """Deprecated: ``model_handles``."""
        warnings.warn(
            "LocalModel.handles is deprecated; use model_handles", DeprecationWarning, stacklevel=2
        )
        return self.model_handles

    @property
    def loaded(self) -> LoadedEngine | None:
        """Deprecated: ``loaded_engine``."""
        warnings.warn(
            "LocalModel.loaded is deprecated; use loaded_engine", DeprecationWarning, stacklevel=2
        )
        return self.loaded_engine

    @property
    def replicas(self) -> tuple[ReplicaStatus, ...]:
        """The one replica: this process."""
        state = "stopped" if self.closed or self.loaded_engine is None else "ready"
        return (
            ReplicaStatus(
                0, not self.closed, self._active, (self.spec.device,), (os.getpid(),), state
            ),
        )

    def start(self) -> LocalModel:
        """Load the model now if it was unloaded meanwhile (it is loaded when returned by load)."""
        if self.closed:
            raise self._closed()
        if self.loaded_engine is None:
            self.engine.reload(self)
        return self

    def close(self) -> None:
        """Cancel queued submissions and unload the model (a call in progress keeps it until it
        ends); later calls fail with ``engine_unavailable``. Idempotent; ``load`` again for a
        new handle."""
        if self.closed:
            return
        self.closed = True
        self._submitter.close()
        self.engine.forget(self)
        self.engine.unload(self)

    def __enter__(self) -> LocalModel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def submit(
        self, capability: str, *arguments: object, request: EngineRequest | None = None
    ) -> Future[object]:
        """Run a call on the model's thread (in order, one at a time) as a standard Future; a
        stream's future resolves to its chunks. Only a call that has not begun can be cancelled
        through the future; a running one stops through ``request.cancel()``."""
        return self._submitter.submit(capability, *arguments, request=request)

    def _closed(self) -> EngineError:
        return self._fail(
            EngineUnavailable(
                f"{self.name} was closed; load it again",
                {"engine": self.engine.engine_id, "reason": "closed"},
            )
        )

    def begin_call(self) -> LoadedEngine:
        """Mark a call as running (the model is then never unloaded) and return the loaded
        engine it runs on, loading the model again first if it was unloaded meanwhile."""
        return self.engine.begin_call(self)

    def end_call(self) -> None:
        self.engine.end_call(self)

    def synthesize(
        self, text: str, request: EngineRequest | None = None
    ) -> Generator[AudioChunk, None, None]:
        """A lazy stream of float32 mono chunks; close it to stop the engine early."""
        call = self._call("synthesize", request)
        return call.stream("synthesize", self._text(text), call.ctx.params)

    def convert(
        self, audio: AudioChunk, request: EngineRequest | None = None
    ) -> Generator[AudioChunk, None, None]:
        call = self._call("convert", request)
        return call.stream("convert", self._audio(audio), call.ctx.params)

    def edit(
        self, audio: AudioChunk, text: str, request: EngineRequest | None = None
    ) -> Generator[AudioChunk, None, None]:
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
            raise self._fail(error) from None
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
        if self.closed:
            raise self._closed()
        if capability not in manifest.capabilities:
            raise self._fail(
                Unsupported(
                    f"engine {manifest.id!r} does not support {capability}; it supports "
                    f"{', '.join(manifest.capabilities)}",
                    {"capability": capability},
                )
            )
        request = request if request is not None else EngineRequest()
        try:  # before any model loads: a bad param is the caller's mistake, named as such
            params = manifest.check_params(request.params)
        except EngineError as error:
            raise self._fail(error) from None
        if self.loaded_engine is None:  # unloaded while idle: load it again (as calls begin)
            self.engine.reload(self)
        try:
            runtime, settings = self.engine.runtime_for_calls(), self.engine.settings
            return Call(
                self,
                request,
                capability,
                params,
                runtime=runtime,
                settings=settings.as_dict(),
                compute=settings.compute,
                fail=self._fail,
                open_calls=self.engine.open_calls,
                turns=self._turns,
            )
        except EngineError as error:
            raise self._fail(error) from None

    def _fail(self, error: BaseException) -> EngineError:
        """The coded error the caller sees; out of memory first frees idle models but this one."""
        return self.engine.failure(error, keep=self)

    def _invalid(self, field: str, message: str) -> EngineError:
        return self._fail(InvalidRequest(f"{field}: {message}", {"field": field}))

    def _text(self, text: object) -> str:
        try:
            return checked_text(text)
        except InvalidRequest as error:
            raise self._fail(error) from None

    def _audio(self, audio: object) -> AudioChunk:
        try:
            return checked_audio(audio)
        except InvalidRequest as error:
            raise self._fail(error) from None

    def collect(
        self, capability: str, *arguments: object, request: EngineRequest | None = None
    ) -> AudioChunk:
        """The whole output of a streaming capability as one float32 mono chunk, computed in one
        step (``collect("synthesize", text)``)."""
        try:
            checked = collected_inputs(capability, arguments)
        except InvalidRequest as error:
            raise self._fail(error) from None
        call = self._call(capability, request)
        return call.collect(capability, *checked.values(), call.ctx.params)
