"""One engine call as the host runs it: context, watcher, inference mode, errors, write-back.

A call runs on the caller's thread. Each step of the engine (the call itself, or one ``next()`` of
its generator) runs inside ``torch.inference_mode()`` with the request context bound (an engine
that declares ``uses_torch=False``: with the context bound only, torch never imported); between
steps the caller's code runs in neither. A watcher thread forwards the caller's cancel event to the
context every 20 ms and cancels the call when its timeout passes. While it runs, a call is listed
in its host's ``OpenCalls`` (``host/stopping.py``), so that a stop of the process can end it.
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
    from mizuoto_sdk.host.stopping import OpenCalls
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
        open_calls: OpenCalls | None = None,
        turns: threading.Semaphore | None = None,
    ) -> None:
        """``params`` are the request's as the manifest checked them; ``runtime`` is None for
        an engine that declares ``uses_torch=False`` (no torch, no memory manager); ``fail``
        turns what engine code raised into the coded error the caller sees; ``open_calls``
        lists the call while it runs, for the host's stop; ``turns`` (the model's
        ``max_concurrency``) is taken before the call begins and given back when it ends."""
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
        self._open_calls = open_calls
        self._turns = turns
        self._has_turn = False
        # A stream's engine generator, stepped by the caller's thread or closed by a stop: one
        # at a time (a generator cannot be closed while it runs).
        self._steps = threading.Lock()
        self._chunks: Iterator[Any] | None = None
        self._engine_closed = False
        self._unwound = threading.Event()

    @property
    def name(self) -> str:
        return self.target.name

    def __enter__(self) -> Call:
        self._started = time.perf_counter()
        if self._turns is not None:
            self._wait_for_turn()
        try:
            return self._begin()
        except BaseException:
            self._give_back_turn()
            raise

    def _wait_for_turn(self) -> None:
        """Queue behind the model's other calls (``max_concurrency``); the request's cancel and
        timeout end the wait as they would end the call."""
        assert self._turns is not None
        while not self._turns.acquire(timeout=WATCH_INTERVAL):
            self.check_cancel()
        self._has_turn = True

    def _give_back_turn(self) -> None:
        if self._has_turn and self._turns is not None:
            self._has_turn = False
            self._turns.release()

    def _begin(self) -> Call:
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
        if self._open_calls is not None:
            self._open_calls.add(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._unwound.set()
        if self._open_calls is not None:
            self._open_calls.discard(self)
        self._done.set()
        if self._watcher is not None:
            self._watcher.join()
        self.ctx.timings["total"] = time.perf_counter() - self._started
        self.request.applied.update(self.ctx.applied)
        self.request.warnings.extend(self.ctx.warnings)
        self.request.timings.update(self.ctx.timings)
        try:
            self._held.close()
            self.target.end_call()
        finally:
            self._give_back_turn()

    def _watch(self) -> None:
        deadline = None if self.request.timeout is None else self._started + self.request.timeout
        while not self._done.wait(WATCH_INTERVAL):
            if self.request.cancel_event.is_set():
                self.ctx.cancel("cancelled")
            elif deadline is not None and time.perf_counter() >= deadline:
                self.ctx.cancel("timeout")

    def stop(self, deadline: float) -> None:
        """Cancel the call for a stop of the host. A stream paused between chunks runs no engine
        code that could see the cancel, so its engine generator is closed here (its ``finally``
        blocks run now); a step in progress is waited for until ``deadline``
        (``time.monotonic()``), and then unwinds on its own thread when it reaches a check."""
        self.ctx.cancel("cancelled")
        if not self._steps.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return
        try:
            if self._chunks is not None and not self._engine_closed:
                with contextlib.suppress(Exception):  # the caller sees the cancel, not this
                    self._close_engine()
                self._unwound.set()
        finally:
            self._steps.release()

    def wait_unwound(self, timeout: float) -> bool:
        """Whether the engine code of this call has ended (or was closed) within ``timeout``."""
        return self._unwound.wait(timeout)

    def _close_engine(self) -> None:
        """Close the stream's engine generator once (hold ``_steps``)."""
        self._engine_closed = True
        close = getattr(self._chunks, "close", None)
        if close is not None:
            self.step(close)

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
            with self._steps:
                self._chunks = self.step(lambda: iter(function(*args, self.ctx)))
            try:
                sample_rate = None
                for index in itertools.count():
                    with self._steps:
                        if self._engine_closed:  # a stop closed it while the caller was away
                            self.check_cancel()
                        chunk = self.step(next, self._chunks, _END)
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
                with self._steps:
                    if not self._engine_closed:
                        self._close_engine()

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
