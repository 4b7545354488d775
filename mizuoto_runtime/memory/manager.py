"""ModelManager: which parts of which models are on which device, phase by phase.

Every weighted component an engine loads is a registered ``ModelHandle`` with an owner (one
per loaded model) and a last use. At each phase of a request (``use`` / ``run``) the
manager places the phase's handles: resident if they fit; otherwise idle handles on that device
first give memory back, unit by unit (least recently used, cheapest to reload first), and then
the phase's own units that still do not fit stay in host memory and are streamed in as they run.
Estimates only shape the plan; nothing is refused on an estimate. When a ``run`` phase hits a
real allocation failure it leaves the ``except`` block (so the failed attempt's tensors are
freed), releases idle units on the failing device and re-runs exactly with fewer units resident,
down a bounded ladder that ends at full streaming; only then does it fail with
``ComputeUnavailable`` (``detail.reason = "out_of_memory"``). Handles in use are never evicted.

This module keeps the registry, the phases and the out-of-memory ladder; what one placement
moves (room on the device, which idle units give memory back, which units stay resident) is
decided by the device's ``placement.DevicePlacement``, called under the manager's lock.

Threads: one re-entrant lock guards the registry, the entries (``occupancy``) and every
placement; phase bodies run outside it. A handle moves only when no other thread's phase runs
it, and a phase that finds the memory held by other threads' phases waits for one to end
(``occupancy.MemoryWaits``). Lock order: manager, then a device's ``Streamer``, then the
device's meter; nothing takes them the other way round.

Where the device's meter says memory is not scarce (a plain CPU) nothing moves and nothing is
counted: ``use`` and ``run`` only mark handles busy.

Exact re-runs: the context's generators are snapshotted before a ``run`` phase and restored
before each retry, so a retry draws what a run that never failed would have drawn. The phase
function must have no other effect that a re-run repeats. For QwenDecoder phases the caller owns
the cache: a forward that fails part-way leaves a DynamicCache's length as it was (its keys are
written again), but a phase of several forwards must build its cache inside the phase.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from mizuoto_runtime.context import RequestContext, current_context
from mizuoto_runtime.memory.handle import ModelHandle, indexed_device
from mizuoto_runtime.memory.occupancy import Entry, Lease, MemoryWaits
from mizuoto_runtime.memory.placement import DevicePlacement
from mizuoto_runtime.memory.policy import (
    Calibration,
    PeakMeter,
    Plan,
    SettingsLike,
    VramPolicy,
    failing_device,
)
from mizuoto_runtime.memory.stream import Streamer
from mizuoto_sdk.errors import ComputeUnavailable

if TYPE_CHECKING:
    from mizuoto_runtime.devices.device import DeviceService
    from mizuoto_runtime.devices.meter import MemoryMeter

__all__ = ["ModelManager"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class ModelManager:
    """Residency of every registered handle; one per process (``Runtime.manager``).

    ``trace`` keeps recent out-of-memory events as dicts, newest last: what failed, what was
    released, what was re-run with which placement, and how it ended.
    """

    def __init__(self, devices: DeviceService, settings: SettingsLike | None = None) -> None:
        self.devices = devices
        self.settings = settings
        self.calibration = Calibration()
        self.trace: deque[dict[str, Any]] = deque(maxlen=256)
        self._entries: dict[ModelHandle, Entry] = {}
        self._devices: dict[str, DevicePlacement] = {}
        self._meter = PeakMeter(devices, self.calibration)
        self._lock = threading.RLock()
        self._waits = MemoryWaits(self._lock)
        self._ticks = itertools.count(1)

    # -- registry --------------------------------------------------------------------------

    def register(self, handles: Iterable[ModelHandle], owner: str) -> None:
        """Track ``handles`` for ``owner``; each device's policy is derived from the settings.

        Their resident bytes are charged to the device's meter; where they do not fit (on a
        simulated device), idle handles give memory back, then the new handle's units wait in
        host memory (nothing is refused).
        """
        with self._lock:
            for handle in handles:
                if handle in self._entries:
                    self._entries[handle].owner = owner
                    continue
                place = self._placement(handle.load_device)
                entry = self._entries[handle] = Entry(handle, owner, place.meter.scarce)
                if entry.scarce:
                    place.policy = self._derive_policy(place.meter)
                place.admit(entry)

    def forget(self, owner: str) -> list[str]:
        """Stop tracking ``owner``'s handles (its engine was unloaded); returns their names."""
        with self._lock:
            gone = [e for e in self._entries.values() if e.owner == owner]
            for entry in gone:
                self._placement(entry.handle.load_device).forget(entry)
                del self._entries[entry.handle]
            for device in {e.handle.load_device for e in gone if e.scarce}:
                self.streamer(device).trim()
            return [e.handle.name for e in gone]

    def residency(self) -> list[dict[str, object]]:
        """One row per handle (for ``mizuoto runtime``): where its bytes are, busy or idle."""
        with self._lock:
            return [
                {
                    "name": e.handle.name,
                    "owner": e.owner,
                    "device": e.handle.load_device,
                    "resident_bytes": e.handle.resident_bytes,
                    "streamed_bytes": e.handle.streamed_bytes,
                    "host_bytes": e.handle.host_bytes,
                    "state": "busy" if e.busy else "idle",
                    "last_used": e.last_used,
                }
                for e in self._entries.values()
            ]

    def offload(self, target: str | None = None) -> list[str]:
        """Send idle handles of owner or name ``target`` (every idle one when None) to host
        memory, where they stay registered; returns the names that gave device memory back.

        Busy handles stay. Unloading the engine itself is the host's job (it then calls
        ``forget``).
        """
        with self._lock:
            chosen = [
                e
                for e in self._entries.values()
                if e.scarce and not e.busy and target in (None, e.owner, e.handle.name)
            ]
            places = [(e.handle, self._placement(e.handle.load_device)) for e in chosen]
            offloaded = [handle for handle, place in places if place.offload(handle)]
            for device in {e.handle.load_device for e in chosen}:
                self.streamer(device).trim()
                self.devices.empty_cache(device)
            return [h.name for h in offloaded]

    def loaded(self) -> list[dict[str, object]]:
        """Deprecated: ``residency()``."""
        _deprecated("loaded()", "residency()")
        return self.residency()

    def unload(self, target: str | None = None) -> list[str]:
        """Deprecated: ``offload(target)`` (it never unloaded anything)."""
        _deprecated("unload(target)", "offload(target)")
        return self.offload(target)

    def release_idle(self, device: str, keep: Sequence[ModelHandle] = ()) -> list[str]:
        """Idle handles on ``device``, all but ``keep``, give their device memory back; names.

        ``"cuda"`` means the current CUDA device, as it does for tensors.
        """
        device = indexed_device(device)
        with self._lock:
            place = self._placement(device)
            names = place.release(None, keep)
            place.streamer.trim()
        self.devices.empty_cache(device)
        return names

    def policy(self, device: str) -> VramPolicy:
        return self._placement(device).policy

    def streamer(self, device: str) -> Streamer:
        """The device's Streamer (staging slots, copies); created on first use."""
        return self._placement(device).streamer

    # -- phases ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def use(
        self,
        *handles: ModelHandle,
        phase: str = "default",
        working_bytes: int | None = None,
        shape: Sequence[int] | None = None,
        release_on_oom: bool = True,
    ) -> Iterator[None]:
        """Hold and place ``handles`` for the block, leaving ``working_bytes`` free.

        A block cannot be re-run: an out-of-memory inside it propagates, after idle handles on
        that device were released (unless ``release_on_oom`` is false: the caller handles the
        error and releases) and the phase's working figure raised for next time (``run``
        re-runs). ``shape`` (batch, length, ...) buckets the calibration.
        """
        lease = self._hold(handles)
        entries = lease.entries
        try:
            if not any(e.scarce for e in entries):
                yield
                return
            plan = self._attempts(lease, Plan(phase, working_bytes, shape), None, None)[0]
            error = None
            try:
                with self._meter.measure(plan.keys()):
                    yield
            except BaseException as exc:
                if not self.devices.is_oom(exc):
                    raise
                error = f"{type(exc).__name__}: {exc}"
                device = failing_device(error, self._devices_of(entries))
                if release_on_oom:
                    self._after_oom(plan, device)
                else:
                    self._calibrate_failure(plan, device)
                raise
        finally:
            self._release(lease)

    @contextlib.contextmanager
    def hold(self, *handles: ModelHandle) -> Iterator[None]:
        """Keep ``handles`` in use for the block without placing them.

        A call that spans several phases, such as a stream paused between chunks, holds its
        handles so that no other request evicts them meanwhile; each phase still places them
        (``use``/``run``), on whichever thread runs it.
        """
        with self._lock:
            entries = [self._entry(handle) for handle in handles]
            for entry in entries:
                entry.calls += 1
        try:
            yield
        finally:
            now = time.time()
            with self._lock:
                for entry in entries:
                    entry.calls -= 1
                    entry.last_used, entry.tick = now, next(self._ticks)

    def run(
        self,
        phase: str,
        fn: Callable[..., T],
        *args: Any,
        handles: Sequence[ModelHandle] = (),
        working_bytes: int | None = None,
        **kwargs: Any,
    ) -> T:
        """``fn(*args, **kwargs)`` with ``handles`` placed; re-run exactly after out of memory."""
        return self.run_phase(
            current_context(), phase, fn, args, kwargs, handles=handles, working_bytes=working_bytes
        )

    def run_phase(
        self,
        context: RequestContext | None,
        phase: str,
        fn: Callable[..., T],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        handles: Sequence[ModelHandle] = (),
        working_bytes: int | None = None,
        shape: Sequence[int] | None = None,
    ) -> T:
        """``run`` whose retries restore ``context``'s random state (``RequestContext.run``)."""
        kwargs = kwargs or {}
        lease = self._hold(tuple(handles))
        try:
            if not any(e.scarce for e in lease.entries):
                return fn(*args, **kwargs)

            def body(plan: Plan) -> T:
                with self._meter.measure(plan.keys()):
                    return fn(*args, **kwargs)

            _, result = self._attempts(lease, Plan(phase, working_bytes, shape), context, body)
            return cast(T, result)  # body ran to its end: result is what it returned
        finally:
            self._release(lease)

    # -- attempts and failures -------------------------------------------------------------

    def _attempts(
        self,
        lease: Lease,
        plan: Plan,
        context: RequestContext | None,
        body: Callable[[Plan], T] | None,
    ) -> tuple[Plan, T | None]:
        """Place, then ``body(plan)``; after out of memory, step down the ladder and again."""
        entries = lease.entries
        state = context.snapshot_random() if context is not None else None
        for attempt in itertools.count(1):
            try:
                with self._lock:
                    mark = self._waits.mark()  # what ends after this may free memory
                    self._place(entries, plan)
                    lease.run()
                result = None if body is None else body(plan)
                if attempt > 1:
                    self._note("done", phase=plan.phase, attempt=attempt, placement=plan.summary())
                return plan, result
            except BaseException as exc:
                if not self.devices.is_oom(exc):
                    raise
                error = f"{type(exc).__name__}: {exc}"
            # Out of the except block now: the failed attempt's frames and tensors are gone,
            # and until the next placement the phase computes nothing with its handles.
            with self._lock:
                lease.stop()
            self._next_level(lease, plan, error, attempt, context, mark)
            plan = plan.retry()
            if context is not None and state is not None:
                context.restore_random(state)
        raise AssertionError("unreachable")

    def _next_level(
        self,
        lease: Lease,
        plan: Plan,
        error: str,
        attempt: int,
        context: RequestContext | None,
        mark: dict[str, int],
    ) -> None:
        """Release idle memory on the failing device and step down the ladder; at the ladder's
        end wait for another thread's phase on the device to end (then climb again), or fail."""
        device = failing_device(error, list(plan.levels) or self._devices_of(lease.entries))
        policy, phase = self.policy(device), plan.phase
        level = plan.levels.get(device)
        self._note("oom", phase=phase, device=device, attempt=attempt, error=error,
                   placement=plan.summary())  # fmt: skip
        released = self._after_oom(plan, device)
        step = policy.ladder(level) if level is not None and level.slot_bytes else None
        if step is None and not released:
            if self._wait_for_memory(lease, device, context, mark):
                plan.cap.pop(device, None)
                self._note("waited", phase=phase, device=device, attempt=attempt + 1)
                return
            self._note("failed", phase=phase, device=device, attempts=attempt)
            raise ComputeUnavailable(
                f"{phase}: out of memory on {device} with every unit streamed, after "
                f"{attempt} attempts; free memory on the device or choose a smaller model",
                {"reason": "out_of_memory", "device": device, "phase": phase}
                | {"attempts": attempt, "error": error},
            )
        if step is not None:
            plan.cap[device] = step
        self._note("retry", phase=phase, device=device, attempt=attempt + 1,
                   unit_bytes=plan.cap.get(device, (None,))[0], released=released)  # fmt: skip

    def _wait_for_memory(
        self, lease: Lease, device: str, context: RequestContext | None, mark: dict[str, int]
    ) -> bool:
        """Whether memory on ``device`` may have been freed since ``mark`` (``MemoryWaits``)."""
        with self._lock:
            waits, entries = self._waits, self._entries.values()
            changed = waits.changed(device, mark)
            place = self._placement(device)
            if [h for h in waits.yielding(lease, device) if place.offload(h)]:
                waits.freed(device)
            self.streamer(device).trim()
            return changed or waits.wait(entries, device, context or current_context())

    def _calibrate_failure(self, plan: Plan, device: str) -> None:
        working = plan.working.get(device)
        if working is not None:
            self.calibration.failed(working[1], working[0])

    def _after_oom(self, plan: Plan, device: str) -> list[str]:
        self._calibrate_failure(plan, device)
        released = self.release_idle(device)
        self._note("release", device=device, names=released)
        return released

    # -- bookkeeping -----------------------------------------------------------------------

    def _placement(self, device: str) -> DevicePlacement:
        """The device's placement (meter, policy, streamer, its handles); made on first use."""
        with self._lock:
            place = self._devices.get(device)
            if place is None:
                meter = self.devices.meter(device)
                place = DevicePlacement(meter, self._derive_policy(meter), self.calibration)
                self._devices[device] = place
            return place

    def _place(self, entries: Sequence[Entry], plan: Plan) -> None:
        """Place the scarce handles no other thread runs; each device's level goes in ``plan``.

        A handle another thread's phase runs (``Entry.running``) keeps its placement: moving
        its tensors under a running forward would break that forward. That phase placed it, so
        it is placed; of phases that start together, the first to get the lock places.
        """
        thread = threading.get_ident()
        by_device: dict[str, list[ModelHandle]] = {}
        for entry in entries:
            if entry.scarce and not entry.running.keys() - {thread}:
                handles = by_device.setdefault(entry.handle.load_device, [])
                if entry.handle not in handles:
                    handles.append(entry.handle)
        for device, handles in by_device.items():
            self._placement(device).place(handles, plan)

    def _derive_policy(self, meter: MemoryMeter) -> VramPolicy:
        total = meter.memory()[1]
        return VramPolicy.from_settings(self.settings, total=total, simulated=meter.exclusive)

    @staticmethod
    def _devices_of(entries: Sequence[Entry]) -> list[str]:
        return sorted({e.handle.load_device for e in entries if e.scarce})

    def _hold(self, handles: Sequence[ModelHandle]) -> Lease:
        lease = Lease(threading.get_ident())
        with self._lock:
            for handle in handles:
                lease.hold(self._entry(handle))
            return lease

    def _entry(self, handle: ModelHandle) -> Entry:
        entry = self._entries.get(handle)
        if entry is not None:
            return entry
        if not isinstance(handle, ModelHandle):  # a module the host wrapped in a handle
            for entry in self._entries.values():
                if entry.handle.module is handle:
                    return entry
            raise TypeError(
                f"{type(handle).__name__} is not a ModelHandle nor a module the host manages"
            )
        self.register([handle], owner=handle.name)  # a handle the host did not register
        return self._entries[handle]

    def _release(self, lease: Lease) -> None:
        now = time.time()
        with self._lock:
            lease.release()
            for entry in lease.entries:
                entry.last_used, entry.tick = now, next(self._ticks)
            self._waits.phase_ended(lease)

    def _note(self, event: str, **detail: Any) -> None:
        self.trace.append({"event": event, **detail})
        log.info("memory %s: %s", event, detail)


def _deprecated(old: str, new: str) -> None:
    warnings.warn(
        f"ModelManager.{old} is deprecated, use ModelManager.{new}; it goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
