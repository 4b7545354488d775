"""Streamer: copies streamed units to their device just ahead of use, one per device.

A streamed unit's weights live in host memory. When the unit is about to run, its tensors are
pointed (``tensor.data = ...``) at views of a *staging slot* on the device, filled from the host
copy; when it has run they are pointed back at the host copy. There are a few slots
(``VramPolicy.in_flight``), each at least the size of the largest streamed unit, allocated once
and reused: while one unit computes, the next streamed unit is already being copied into another
slot. A slot that still holds a unit is reused without copying when that unit runs again (a
model with one streamed unit copies it once).

Threads. A module's tensors are shared by every thread that runs it, so a unit is *entered* once
for all of them: the first ``enter`` records the host copy and points the tensors at the slot,
later ones (any thread) only count themselves in, and the last ``exit`` points the tensors back.
Counts are kept per thread, so an ``exit`` from a thread that never entered (a forward hook that
runs after a failed ``enter``) changes nothing. A slot that a unit runs from is never refilled,
resized or freed; plan changes (``configure``, ``release``) apply to the free slots at once and
to the others when their last user leaves. When every slot is in use, ``enter`` waits for one,
bounded by the cancel and timeout of the call bound to the thread (``current_context()``); it
fails at once only when the wait could never end (every slot held by threads that wait too, as
with units nested inside units).

One condition (``Streamer._cond``) guards all of a streamer's state; nothing else is locked
while holding it except the device's meter (``MemoryMeter.charge``). The memory manager
calls ``configure``, ``apply``, ``attach``, ``detach`` and ``release`` with its own lock held
(lock order: manager, then streamer); models call ``enter`` and ``exit`` with no lock held.

On CUDA the host copies are pinned, copies run on a side stream, the compute stream waits on an
event recorded after each copy, and a copy into a slot waits for the last kernels that read it.
Every slot allocated or freed is charged to the device's meter (which counts it on a simulated
device, where slots are host tensors standing for device memory, and leaves it to torch's
allocator elsewhere); copies are synchronous off CUDA.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mizuoto_runtime.context import current_context
from mizuoto_runtime.memory.handle import RESIDENT, STREAMED, ModelHandle, Part
from mizuoto_runtime.memory.units import route

if TYPE_CHECKING:
    import torch

    from mizuoto_runtime.devices.meter import MemoryMeter

__all__ = ["Streamer", "stage_bytes"]

_ALIGN = 256  # bytes; every staged tensor starts on a boundary any dtype and kernel accepts
_CANCEL_POLL = 0.02  # seconds between cancel checks while waiting for a slot (as the watcher)


def stage_bytes(part: Part) -> int:
    """Bytes of staging slot ``part`` needs (its tensors, each aligned)."""
    return sum(-(-t.nbytes // _ALIGN) * _ALIGN for t in part.tensors)


class _Slot:
    __slots__ = ("buffer", "free_events", "part", "ready_event", "signature", "views")

    def __init__(self, buffer: torch.Tensor) -> None:
        self.buffer = buffer
        self.part: Part | None = None  # the unit whose copy the slot holds
        self.views: list[torch.Tensor] = []
        self.signature: list[tuple[torch.dtype, torch.Size]] = []
        self.ready_event: Any = None  # copy finished (CUDA)
        self.free_events: dict[int, Any] = {}  # stream -> its last reader finished (CUDA)


class _Entered:
    """A unit whose tensors point at its slot: the host copy to restore and who runs it."""

    __slots__ = ("host", "slot", "users")

    def __init__(self, slot: _Slot, host: list[torch.Tensor]) -> None:
        self.slot, self.host = slot, host
        self.users: dict[int, int] = {}  # thread id -> enters not yet exited


class Streamer:
    """Staging slots and copy scheduling for the streamed units on one device."""

    def __init__(self, meter: MemoryMeter) -> None:
        import torch

        self.device = meter.device
        self._meter = meter
        self._torch = torch
        self._cuda = self.device.startswith("cuda")
        self._side = torch.cuda.Stream(torch.device(self.device)) if self._cuda else None
        self._cond = threading.Condition(threading.RLock())
        self._slots: list[_Slot] = []  # filled longest ago first
        self._count = 0  # slots the plan asks for
        self._size = 0  # bytes each slot is grown to at least
        self._entered: dict[Part, _Entered] = {}
        self._waiting: set[int] = set()  # threads waiting for a slot
        self._next: dict[Part, Part] = {}
        self._routes: dict[ModelHandle, Callable[[], None]] = {}  # each undoes a ``route``
        self._attached: dict[ModelHandle, list[Part]] = {}

    @property
    def staging_bytes(self) -> int:
        with self._cond:
            return sum(slot.buffer.numel() for slot in self._slots)

    @property
    def slot_bytes(self) -> int:
        with self._cond:
            return max((slot.buffer.numel() for slot in self._slots), default=0)

    def configure(self, slots: int, slot_bytes: int) -> int:
        """Keep ``slots`` slots of at least ``slot_bytes``; returns the change in device bytes.

        Free slots that are too small or too many are dropped and the missing ones added now,
        all added at once or (out of memory) none; a slot a unit runs from is dropped when it is
        free, if the plan no longer has it. The same plan again allocates nothing.
        """
        if slots <= 0 or slot_bytes <= 0:
            return -self.release()
        with self._cond:
            before = sum(slot.buffer.numel() for slot in self._slots)
            self._count, self._size = slots, -(-slot_bytes // _ALIGN) * _ALIGN
            for slot in [s for s in self._slots if not self._busy(s)]:
                if slot.buffer.numel() < self._size:
                    self._drop(slot)
            free = [slot for slot in self._slots if not self._busy(slot)]
            for slot in free[: max(len(self._slots) - slots, 0)]:
                self._drop(slot)
            large = sum(slot.buffer.numel() >= self._size for slot in self._slots)
            missing = max(slots - large, 0)
            self._account(missing * self._size)
            with self._torch.inference_mode(False):
                self._slots[:0] = [_Slot(self._empty(self._size)) for _ in range(missing)]
            self._cond.notify_all()
            return sum(slot.buffer.numel() for slot in self._slots) - before

    def apply(
        self,
        handles: Sequence[ModelHandle],
        resident: Sequence[Part],
        streamed: Sequence[Part],
        slots: int,
        slot_bytes: int,
    ) -> None:
        """Carry out a placement: memory is made before it is used (streamed parts leave the
        device, then the slots are sized, then bases and resident parts come in), then the
        streamed units are routed through this streamer. The caller guarantees that no thread
        runs ``handles`` meanwhile (the manager moves only handles no other phase runs)."""
        for part in streamed:
            part.handle.move(part, STREAMED)
        if slots:
            self.configure(slots, slot_bytes)
        for handle in handles:
            handle.move(handle.base, RESIDENT)
        for part in resident:
            part.handle.move(part, RESIDENT)
        for handle in handles:
            self.attach(handle)
        if not slots:
            self.trim()

    def trim(self) -> None:
        """Free the slots once no handle streams through them."""
        with self._cond:
            if not self._attached:
                self.release()

    def release(self) -> int:
        """Free every slot no unit runs from (the others when it leaves); returns bytes freed."""
        with self._cond:
            self._count = 0
            freed = 0
            for slot in [slot for slot in self._slots if not self._busy(slot)]:
                freed += self._drop(slot)
            return freed

    def attach(self, handle: ModelHandle) -> None:
        """Route ``handle``'s streamed units through this streamer (a gate or forward hooks)."""
        streamed = [p for p in handle.unit_parts if p.state == STREAMED]
        with self._cond:
            if self._attached.get(handle) == streamed:
                return  # the same plan as last phase: keep the gate and what the slots hold
            self.detach(handle)
            if not streamed:
                return
            self._attached[handle] = streamed
            for current, following in zip(streamed, streamed[1:] + streamed[:1], strict=True):
                self._next[current] = following
            parts = {id(p.module): p for p in streamed}
            self._routes[handle] = route(
                handle.module,
                [p.module for p in streamed],  # type: ignore[misc]  # a unit part holds its module
                lambda unit: self.enter(parts[id(unit)]),
                lambda unit: self.exit(parts[id(unit)]),
            )

    def detach(self, handle: ModelHandle) -> None:
        """Stop streaming ``handle``'s units (after they were made resident or sent to host).

        A unit some thread still runs keeps its slot until that thread's ``exit``.
        """
        with self._cond:
            self._attached.pop(handle, None)
            for part in handle.unit_parts:
                self._next.pop(part, None)
                for slot in self._slots:
                    if slot.part is part and part not in self._entered:
                        slot.part = None
            undo = self._routes.pop(handle, None)
            if undo is not None:
                undo()

    def enter(self, part: Part) -> None:
        """Point ``part``'s tensors at its staged copy on the device; start copying the next.

        Waits while every slot is in use; raises the bound call's ``CancelledError`` or
        ``OperationTimeoutError`` when it is stopped meanwhile.
        """
        me = threading.get_ident()
        with self._cond:
            # Waiting releases the lock, and meanwhile another thread may enter ``part``:
            # whatever was seen before a wait is looked at again after it.
            while (entered := self._entered.get(part)) is None:
                slot = self._slot_of(part) or self._claim(part)
                if slot is None:
                    self._wait(part, me)
                    continue
                entered = self._entered[part] = _Entered(slot, [t.data for t in part.tensors])
                for tensor, view in zip(part.tensors, slot.views, strict=True):
                    tensor.data = view
                self._prefetch(part, slot)
            entered.users[me] = entered.users.get(me, 0) + 1
            if self._cuda and entered.slot.ready_event is not None:
                self._torch.cuda.current_stream(self.device).wait_event(entered.slot.ready_event)

    def exit(self, part: Part) -> None:
        """This thread is done with ``part``; the last to leave points it back at the host copy."""
        me = threading.get_ident()
        with self._cond:
            entered = self._entered.get(part)
            if entered is None or me not in entered.users:
                return  # this thread's enter failed (or never happened): nothing to undo
            slot = entered.slot
            if self._cuda:
                stream = self._torch.cuda.current_stream(self.device)
                slot.free_events[stream.cuda_stream] = stream.record_event()
            entered.users[me] -= 1
            if entered.users[me]:
                return
            del entered.users[me]
            if entered.users:
                return
            del self._entered[part]
            for tensor, original in zip(part.tensors, entered.host, strict=True):
                tensor.data = original
            self._settle(slot)
            self._cond.notify_all()

    # -- under self._cond ------------------------------------------------------------------

    def _busy(self, slot: _Slot) -> bool:
        return slot.part is not None and slot.part in self._entered

    def _slot_of(self, part: Part) -> _Slot | None:
        for slot in self._slots:
            if slot.part is part:
                return slot
        return None

    def _free_slot(self, current: _Slot | None, need: int = 0) -> _Slot | None:
        """The slot filled longest ago that no unit runs from and holds ``need`` bytes, or None."""
        for slot in self._slots:
            if slot is not current and not self._busy(slot) and slot.buffer.numel() >= need:
                return slot
        return None

    def _claim(self, part: Part) -> _Slot | None:
        """A slot filled with ``part``'s copy (a free one refilled), or None: all are in use.

        Slots are allocated by ``configure`` (a placement, where running out of memory is
        handled); only when the plan has fewer slots than it asks for, or none large enough
        for ``part``, is one added or grown here.
        """
        need = stage_bytes(part)
        slot = self._free_slot(None, need)
        if slot is None and len(self._slots) < max(self._count, 1):
            self._account(max(need, self._size))
            with self._torch.inference_mode(False):
                slot = _Slot(self._empty(max(need, self._size)))
            self._slots.append(slot)
        elif slot is None and all(s.buffer.numel() < need for s in self._slots):
            small = self._free_slot(None)
            slot = None if small is None else self._grow(small, max(need, self._size))
        if slot is not None:
            self._stage(part, slot)
        return slot

    def _wait(self, part: Part, me: int) -> None:
        users = {t for s in self._slots if s.part in self._entered for t in self._users(s)}
        if users <= self._waiting | {me}:
            raise RuntimeError(
                f"{part!r}: every staging slot on {self.device} is held by a unit that waits for "
                "another slot (units nested inside units); raise compute.stream_in_flight"
            )
        context = current_context()
        if context is not None:
            context.check_cancel()
        self._waiting.add(me)
        try:
            self._cond.wait(_CANCEL_POLL)
        finally:
            self._waiting.discard(me)
        if context is not None:
            context.check_cancel()

    def _users(self, slot: _Slot) -> list[int]:
        assert slot.part is not None
        return list(self._entered[slot.part].users)

    def _prefetch(self, part: Part, slot: _Slot) -> None:
        """Copy the unit after ``part`` into a free slot while ``part`` computes."""
        following = self._next.get(part)
        if following is None or following is part or self._slot_of(following) is not None:
            return
        spare = self._free_slot(slot, stage_bytes(following))
        if spare is not None:
            self._stage(following, spare)

    def _settle(self, slot: _Slot) -> None:
        """A slot just left free follows the plan: dropped when too small or too many."""
        if slot.buffer.numel() < self._size or len(self._slots) > self._count:
            self._drop(slot)

    def _grow(self, slot: _Slot, size: int) -> _Slot:
        """An empty slot of ``size`` bytes in the free ``slot``'s place."""
        self._account(size - slot.buffer.numel())
        with self._torch.inference_mode(False):
            grown = _Slot(self._empty(size))
        self._retire(slot)
        self._slots[self._slots.index(slot)] = grown
        return grown

    def _drop(self, slot: _Slot) -> int:
        self._retire(slot)
        self._slots.remove(slot)
        self._account(-slot.buffer.numel())
        return slot.buffer.numel()

    def _retire(self, slot: _Slot) -> None:
        """Before a slot's memory goes back: its copy and its readers are done (CUDA)."""
        if slot.ready_event is not None:
            slot.ready_event.synchronize()
        for event in slot.free_events.values():
            event.synchronize()

    def _empty(self, size: int) -> torch.Tensor:
        return self._torch.empty(size, dtype=self._torch.uint8, device=self.device)

    def _account(self, delta: int) -> None:
        if delta:
            self._meter.charge(delta)

    def _stage(self, part: Part, slot: _Slot) -> None:
        """Copy ``part``'s host tensors into the free ``slot``."""
        self._slots.remove(slot)
        self._slots.append(slot)  # most recently filled last
        signature = [(t.dtype, t.shape) for t in part.tensors]
        if signature != slot.signature:
            slot.views, slot.signature = _views(slot.buffer, part.tensors, self._torch), signature
        slot.part = part
        if self._cuda:
            self._copy_async(slot, part)
        else:
            for view, tensor in zip(slot.views, part.tensors, strict=True):
                view.copy_(tensor.data)

    def _copy_async(self, slot: _Slot, part: Part) -> None:
        side = self._side
        assert side is not None
        with self._torch.cuda.stream(side):
            for event in slot.free_events.values():
                side.wait_event(event)
            slot.free_events = {}
            for view, tensor in zip(slot.views, part.tensors, strict=True):
                view.copy_(tensor.data, non_blocking=True)
            slot.ready_event = side.record_event()


def _views(buffer: torch.Tensor, tensors: Sequence[torch.Tensor], torch: Any) -> list[Any]:
    """Views of the byte ``buffer`` shaped and typed like ``tensors``, each aligned."""
    views, offset = [], 0
    with torch.inference_mode(False):
        for tensor in tensors:
            size = tensor.nbytes
            view = buffer[offset : offset + size].view(tensor.dtype).view(tensor.shape)
            views.append(view)
            offset += -(-size // _ALIGN) * _ALIGN
    return views
