"""The per-call context an engine receives: its randomness, cancellation, progress and report.

Cancellation reaches an engine two ways: ``check_cancel()`` between steps of Python work, and
``on_cancel(fn)`` callbacks for work that blocks outside Python (a child process, a socket, a
native library), which no check can interrupt. ``open_process`` / ``run_process`` build on the
callbacks to kill a child process's group when the call is cancelled or times out.

Engines draw every random number from ``generator_for(device)`` or ``rng``, both seeded from the
request's seed, so a seeded call is reproducible and no process-global generator is touched. A
fresh ``torch.Generator`` seeded ``s`` yields what the default generator yields after
``torch.manual_seed(s)``, so sampling on it in upstream's order reproduces upstream's seeded run.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from mizuoto_runtime.parallel import Groups
from mizuoto_runtime.process import open_process, run_process
from mizuoto_sdk.compute import ComputeSettings
from mizuoto_sdk.errors import CancelledError, InvalidRequest, OperationTimeoutError
from mizuoto_sdk.request import ProgressCallback

if TYPE_CHECKING:
    import os
    import queue
    import subprocess
    from collections.abc import Sequence

    import numpy as np
    import torch

    # snapshot_random's value: each device's generator state, and the numpy rng's (or None)
    RandomState = tuple[dict[str, torch.Tensor], Mapping[str, Any] | None]


log = logging.getLogger(__name__)

T = TypeVar("T")

_SEED_LIMIT = 2**63
_current: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "mizuoto_request_context", default=None
)


class Residency(Protocol):
    """What a context asks of the memory manager (``ModelManager`` is one); the handles are
    ``ModelHandle``s, typed loosely here because the manager sits in a layer above this one."""

    def use(
        self,
        *handles: Any,
        phase: str,
        working_bytes: int | None,
        shape: Sequence[int] | None,
    ) -> contextlib.AbstractContextManager[object]: ...

    def run_phase(
        self,
        context: RequestContext | None,
        phase: str,
        fn: Callable[..., T],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        handles: Sequence[Any],
        working_bytes: int | None,
        shape: Sequence[int] | None,
    ) -> T: ...


def current_context() -> RequestContext | None:
    """The context bound to the running call, for runtime pieces that are not handed one."""
    return _current.get()


def check_seed(seed: object, field: str = "params.seed") -> int | None:
    """None, or an int in [0, 2**63); anything else is an InvalidRequest naming ``field``."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < _SEED_LIMIT:
        raise InvalidRequest(
            f"{field}: expected an integer in [0, 2**63) or nothing, got {seed!r}", {"field": field}
        )
    return seed


class RequestContext:
    """Everything an engine call may use besides its inputs.

    ``compute`` is the call's compute settings (``ctx.compute.kv_cache``), typed and checked: the
    host passes them; without them they come from the ``compute.*`` keys of ``settings`` (an
    unknown one is an InvalidRequest), defaults elsewhere. ``settings`` holds the host's other
    settings as dotted keys (``voices.roots``). ``applied`` records the settings and fallbacks
    that were actually used, ``warnings`` what the caller should know, ``timings`` named durations
    in seconds; the host copies all three back to the request when the call ends. ``parallel``:
    this rank's named groups when the replica spans several ranks (``ctx.parallel``).
    """

    def __init__(
        self,
        *,
        seed: int | None = None,
        params: Mapping[str, object] | None = None,
        settings: Mapping[str, object] | None = None,
        progress: ProgressCallback | None = None,
        text_input: queue.Queue[str | None] | None = None,
        manager: Residency | None = None,
        compute: ComputeSettings | None = None,
        parallel: Groups | None = None,
    ) -> None:
        chosen = check_seed(seed)
        if parallel is not None and not isinstance(parallel, Groups):
            raise TypeError(f"parallel: expected Groups, got {type(parallel).__name__}")
        if compute is None:
            compute = ComputeSettings.from_settings(settings or {})
        elif not isinstance(compute, ComputeSettings):
            raise TypeError(f"compute: expected ComputeSettings, got {type(compute).__name__}")
        self.compute: ComputeSettings = compute
        self.seed: int = secrets.randbits(63) if chosen is None else chosen
        self.params: Mapping[str, object] = MappingProxyType(dict(params or {}))
        self.settings: Mapping[str, object] = MappingProxyType(dict(settings or {}))
        self.text_input = text_input
        self.applied: dict[str, Any] = {"seed": self.seed}
        self.warnings: list[str] = []
        self.timings: dict[str, float] = {}
        self._progress = progress
        self._cancel = threading.Event()
        self._reason = "cancelled"
        self._cancel_lock = threading.Lock()
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next_callback = 0
        self._generators: dict[str, torch.Generator] = {}
        self._rng: np.random.Generator | None = None
        self.manager = manager
        self._parallel = parallel

    @property
    def parallel(self) -> Groups:
        """This rank's named process groups (``Groups.single()`` outside a multi-rank replica)."""
        if self._parallel is None:
            self._parallel = Groups.single()
        return self._parallel

    def generator_for(self, device: str | torch.device | int) -> torch.Generator:
        """This call's torch generator for ``device``, seeded with the request's seed.

        Repeated calls return the same generator, so draws continue one stream per device.
        """
        import torch

        key = str(torch.device(device))
        generator = self._generators.get(key)
        if generator is None:
            generator = torch.Generator(device=key)
            generator.manual_seed(self.seed)
            self._generators[key] = generator
        return generator

    @property
    def rng(self) -> np.random.Generator:
        """A numpy generator seeded with the request's seed, for engines that sample on the host."""
        if self._rng is None:
            import numpy as np

            self._rng = np.random.default_rng(self.seed)
        return self._rng

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop the engine at its next ``check_cancel()``; ``reason``: cancelled or timeout.

        The first cancel runs the ``on_cancel`` callbacks on the calling thread; later ones do
        nothing more (the host's watcher repeats its cancel until the call ends).
        """
        with self._cancel_lock:
            if self._cancel.is_set():
                return
            self._reason = reason
            self._cancel.set()
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
        for callback in callbacks:
            _run_callback(callback)

    def on_cancel(self, callback: Callable[[], None]) -> CancelCallback:
        """Call ``callback()`` once when this call is cancelled or times out.

        For work that blocks outside Python and never reaches ``check_cancel()``: the callback
        unblocks it (kills a child process, closes a socket). It runs on whichever thread cancels
        the call (the host's watcher, within about 20 ms), or at once on this thread if the call is
        already cancelled; it must be quick and thread-safe. An exception it raises is logged,
        never raised into the canceller. ``remove()`` on the result (or leaving it as a ``with``
        block) unregisters it.
        """
        if not callable(callback):
            raise TypeError(f"on_cancel: expected a callable, got {type(callback).__name__}")
        with self._cancel_lock:
            if not self._cancel.is_set():
                key = self._next_callback
                self._next_callback += 1
                self._callbacks[key] = callback
                return CancelCallback(self, key)
        _run_callback(callback)
        return CancelCallback(self, None)

    def _remove_callback(self, key: int) -> None:
        with self._cancel_lock:
            self._callbacks.pop(key, None)

    def open_process(
        self, args: Sequence[str | os.PathLike[str]], **popen: Any
    ) -> contextlib.AbstractContextManager[subprocess.Popen[Any]]:
        """A child process killed with its process group on cancel, timeout or leaving the block.

        See ``mizuoto_runtime.process.open_process``.
        """
        return open_process(self, args, **popen)

    def run_process(
        self, args: Sequence[str | os.PathLike[str]], **options: Any
    ) -> subprocess.CompletedProcess[Any]:
        """Run a child process to its end, killed on cancel or timeout.

        See ``mizuoto_runtime.process.run_process``.
        """
        return run_process(self, args, **options)

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Block until cancelled or ``timeout`` passes, for engines waiting on something else."""
        return self._cancel.wait(timeout)

    def check_cancel(self) -> None:
        """Raise CancelledError (or OperationTimeoutError) when the call has been stopped."""
        if self._cancel.is_set():
            if self._reason == "timeout":
                raise OperationTimeoutError("the call ran past its timeout", {"reason": "timeout"})
            raise CancelledError("the call was cancelled", {"reason": "cancelled"})

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report progress (e.g. ``done=3, total=10``); a no-op when nobody listens."""
        if self._progress is not None:
            self._progress(done, total, message)

    def warn(self, message: str) -> None:
        """Tell the caller something went differently than asked (a fallback, a clamp)."""
        log.warning("%s", message)
        self.warnings.append(message)

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Add the wall time of the block to ``timings[name]``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start

    @contextlib.contextmanager
    def bind(self) -> Iterator[RequestContext]:
        """Make this the ``current_context()`` of the running thread for the block."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    @contextlib.contextmanager
    def use(
        self,
        *handles: Any,
        phase: str = "default",
        working_bytes: int | None = None,
        shape: Sequence[int] | None = None,
    ) -> Iterator[None]:
        """Hold ``handles`` on their device for the block (``ModelManager.use``).

        Without a manager (an engine run outside a host) the block just runs.
        """
        if self.manager is None:
            yield
            return
        with self.manager.use(*handles, phase=phase, working_bytes=working_bytes, shape=shape):
            yield

    def run(
        self,
        phase: str,
        fn: Callable[..., T],
        *args: Any,
        handles: Sequence[Any] = (),
        working_bytes: int | None = None,
        shape: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> T:
        """``fn(*args, **kwargs)`` as phase ``phase`` of this call (``ModelManager.run``).

        After an out-of-memory the manager re-runs ``fn`` with more of the model streamed and
        this context's generators restored, so ``fn`` must have no other effect a re-run would
        repeat. Without a manager ``fn`` runs once.
        """
        if self.manager is None:
            return fn(*args, **kwargs)
        return self.manager.run_phase(
            self, phase, fn, args, kwargs, handles=handles, working_bytes=working_bytes, shape=shape
        )

    def snapshot_random(self) -> RandomState:
        """The state of this call's generators, for ``restore_random`` before a re-run."""
        rng = None if self._rng is None else self._rng.bit_generator.state
        return {key: g.get_state() for key, g in self._generators.items()}, rng

    def restore_random(self, state: RandomState) -> None:
        """Put the generators back as ``snapshot_random`` saw them (later ones start afresh)."""
        generators, rng = state
        for key in list(self._generators):
            if key not in generators:
                del self._generators[key]
        for key, saved in generators.items():
            self._generators[key].set_state(saved)
        if rng is None:
            self._rng = None
        elif self._rng is not None:
            self._rng.bit_generator.state = rng


class CancelCallback:
    """A registered ``on_cancel`` callback; ``remove()`` or leaving a ``with`` unregisters it."""

    def __init__(self, context: RequestContext, key: int | None) -> None:
        self._context = context
        self._key = key

    def remove(self) -> None:
        """Stop the callback from being called; harmless after it ran or was removed."""
        if self._key is not None:
            self._context._remove_callback(self._key)
            self._key = None

    def __enter__(self) -> CancelCallback:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


def _run_callback(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:
        # The canceller (often the host's watcher) cannot act on it; the engine's author can.
        log.exception("on_cancel callback %r failed", callback)
