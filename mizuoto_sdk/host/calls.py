"""One engine call as the host runs it: context, watcher, inference mode, errors, write-back.

A call runs on the caller's thread. Each step of the engine (the call itself, or one ``next()`` of
its generator) runs inside ``torch.inference_mode()`` with the request context bound (an engine
that declares ``uses_torch=False``: with the context bound only, torch never imported); between
steps the caller's code runs in neither. A watcher thread forwards the caller's cancel event to the
context every 20 ms and cancels the call when its timeout passes.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from mizuoto_runtime.context import RequestContext
from mizuoto_sdk.audio import host_chunk
from mizuoto_sdk.errors import EngineError
from mizuoto_sdk.types import AudioChunk

if TYPE_CHECKING:
    from mizuoto_runtime.runtime import Runtime
    from mizuoto_sdk.compute import ComputeSettings
    from mizuoto_sdk.engine import LoadedEngine
    from mizuoto_sdk.request import EngineRequest

T = TypeVar("T")
WATCH_INTERVAL = 0.02
_END = object()


class CallTarget(Protocol):
    """The loaded model a call runs on (``LocalModel`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def model_handles(self) -> Sequence[Any]: ...

    def begin_call(self) -> LoadedEngine: ...

    def end_call(self) -> None: ...


class Call:
    """The lifetime of one call on a model; use as a context manager around all of its steps."""

    def __init__(
        self,
        target: CallTarget,
        request: EngineRequest,
        capability: str,
        params: Mapping[str, object],
        *,
        runtime: Runtime | None,
        settings: Mapping[str, object],
        compute: ComputeSettings,
        fail: Callable[[BaseException], EngineError],
    ) -> None:
        """``params`` are the request's as the manifest checked them; ``runtime`` is None for
        an engine that declares ``uses_torch=False`` (no torch, no memory manager); ``fail``
        turns what engine code raised into the coded error the caller sees."""
        self.target = target
        self.request = request
        self.capability = capability
        self._runtime = runtime
        self._manager = runtime.manager if runtime is not None else None
        self._fail = fail
        self.ctx = RequestContext(
            seed=cast("int | None", params.get("seed")),  # checked against SEED by the host
            params=params,
            settings=settings,
            compute=compute,
            progress=request.progress,
            text_input=request.text_input,
            manager=self._manager,
            parallel=runtime.parallel if runtime is not None else None,  # this rank's groups
        )
        self._started = 0.0
        self.loaded_engine: LoadedEngine | None = None  # set when the call begins
        self._done = threading.Event()
        self._watcher: threading.Thread | None = None

    def __enter__(self) -> Call:
        self._started = time.perf_counter()
        # The engine this call runs on: loaded again if the model was unloaded since the
        # caller got the handle, and kept loaded until the call ends.
        self.loaded_engine = self.target.begin_call()
        # Between its steps (a stream paused between chunks) the model stays in use.
        self._held = contextlib.ExitStack()
        if self._manager is not None:
            self._held.enter_context(self._manager.hold(*self.target.model_handles))
        self._watcher = threading.Thread(
            target=self._watch, name=f"mizuoto-watch-{self.target.name}", daemon=True
        )
        self._watcher.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        if self._watcher is not None:
            self._watcher.join()
        self.ctx.timings["total"] = time.perf_counter() - self._started
        self.request.applied.update(self.ctx.applied)
        self.request.warnings.extend(self.ctx.warnings)
        self.request.timings.update(self.ctx.timings)
        self._held.close()
        self.target.end_call()

    def _watch(self) -> None:
        deadline = None if self.request.timeout is None else self._started + self.request.timeout
        while not self._done.wait(WATCH_INTERVAL):
            if self.request.cancel_event.is_set():
                self.ctx.cancel("cancelled")
            elif deadline is not None and time.perf_counter() >= deadline:
                self.ctx.cancel("timeout")

    def step(self, function: Callable[..., T], *args: Any) -> T:
        """Run one piece of engine code: inference mode, context bound, errors mapped.

        The model's handles are held (never evicted) and placed on the device for the step, so an
        engine that declares handles but never calls ``ctx.use`` still finds its weights there.
        An engine that declares ``uses_torch=False`` runs with the context bound and nothing else.
        """
        try:
            with self._scope():
                return function(*args)
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # sys.exit in engine code must not end the host
            mapped = self._fail(error)
            if mapped is error:
                raise
            raise mapped from error

    @contextlib.contextmanager
    def _scope(self) -> Iterator[None]:
        if self._runtime is None:
            with self.ctx.bind():
                yield
            return
        with (
            self._runtime.inference_mode(),
            self.ctx.bind(),
            self._runtime.manager.use(
                *self.target.model_handles, phase=self.capability, release_on_oom=False
            ),
        ):
            yield

    def check_cancel(self) -> None:
        """The host's own check between steps, for engines that never reach theirs.

        It reads the request itself, so a cancel or timeout that the watcher has not forwarded
        yet (it looks every 20 ms) still ends a fast stream at its next chunk.
        """
        if self.request.cancel_event.is_set():
            self.ctx.cancel("cancelled")
        elif (
            self.request.timeout is not None
            and time.perf_counter() >= self._started + self.request.timeout
        ):
            self.ctx.cancel("timeout")
        try:
            self.ctx.check_cancel()
        except EngineError as error:
            raise self._fail(error) from None

    def run(self, method: str, *args: Any) -> Any:
        """A call of the loaded engine's ``method`` that returns a value (prepare_voice, call)."""
        with self:
            self.check_cancel()
            result = self.step(getattr(self.loaded_engine, method), *args, self.ctx)
            self.check_cancel()
            return result

    def stream(self, method: str, *args: Any) -> Generator[AudioChunk, None, None]:
        """Drive the loaded engine's generator ``method`` lazily: it runs only while the caller
        asks for a chunk."""
        with self:
            self.check_cancel()
            function = getattr(self.loaded_engine, method)
            chunks = self.step(lambda: iter(function(*args, self.ctx)))
            try:
                sample_rate = None
                for index in itertools.count():
                    chunk = self.step(next, chunks, _END)
                    if chunk is _END:
                        return
                    converted = self.step(host_chunk, chunk, index)
                    if sample_rate is None:
                        sample_rate = converted.sample_rate
                        self.ctx.timings["first_chunk"] = time.perf_counter() - self._started
                    elif converted.sample_rate != sample_rate:
                        raise self._fail(
                            EngineError(
                                f"chunk {index} has sample_rate {converted.sample_rate}, "
                                f"earlier chunks {sample_rate}: a stream keeps one rate"
                            )
                        )
                    self.check_cancel()
                    yield converted
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    self.step(close)

    def collect(self, method: str, *args: Any) -> AudioChunk:
        """The whole output of the loaded engine's generator ``method`` as one float32 mono
        chunk, computed in one step."""
        import numpy as np

        def whole() -> AudioChunk:
            # The engine this call runs on: a call that begins may have loaded the model again.
            chunks = iter(getattr(self.loaded_engine, method)(*args, self.ctx))
            try:
                converted = [host_chunk(chunk, index) for index, chunk in enumerate(chunks)]
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()
            if not converted:
                raise EngineError(f"{method} yielded no chunk")
            rates = {c.sample_rate for c in converted}
            if len(rates) > 1:
                raise EngineError(f"{method} yielded chunks at {sorted(rates)} Hz: one rate only")
            return AudioChunk(
                np.concatenate([c.samples for c in converted]), converted[0].sample_rate
            )

        with self:
            self.check_cancel()
            result = self.step(whole)
            self.check_cancel()
        return result
