"""Streamer: copies streamed units to their device just ahead of use, one per device.

A streamed unit's weights live in host memory. When the unit is about to run, its tensors are
pointed (``tensor.data = ...``) at views of a *staging slot* on the device, filled from the host
copy; when it has run they are pointed back at the host copy. There are a few slots
(``VramPolicy.in_flight``), each the size of the largest streamed unit, allocated once and
reused: while one unit computes, the next streamed unit is already being copied into another
slot. A slot that still holds a unit is reused without copying when that unit runs again (a
model with one streamed unit copies it once).

On CUDA the host copies are pinned, copies run on a side stream, the compute stream waits on an
event recorded after each copy, and a copy into a slot waits on an event recorded after the last
kernel that read it. On a simulated device (``DeviceService(simulate={"cpu": ...})``) slots are
CPU tensors standing for device memory: the copies and the accounting are real, only
synchronous.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mizuoto_runtime.handle import RESIDENT, STREAMED, ModelHandle, Part
from mizuoto_runtime.units import calls_gate

if TYPE_CHECKING:
    import torch
    from torch import nn

    from mizuoto_runtime.device import DeviceService

__all__ = ["Streamer", "stage_bytes"]

_ALIGN = 256  # bytes; every staged tensor starts on a boundary any dtype and kernel accepts


def stage_bytes(part: Part) -> int:
    """Bytes of staging slot ``part`` needs (its tensors, each aligned)."""
    return sum(-(-t.nbytes // _ALIGN) * _ALIGN for t in part.tensors)


class _Slot:
    __slots__ = ("buffer", "busy", "free_event", "part", "ready_event", "signature", "views")

    def __init__(self, buffer: torch.Tensor) -> None:
        self.buffer = buffer
        self.part: Part | None = None  # the unit whose copy the slot holds
        self.views: list[torch.Tensor] = []
        self.signature: list[tuple[torch.dtype, torch.Size]] = []
        self.busy = False  # the unit is running from this slot
        self.ready_event: Any = None  # copy finished (CUDA)
        self.free_event: Any = None  # last reader finished (CUDA)


class Streamer:
    """Staging slots and copy scheduling for the streamed units on one device."""

    def __init__(self, device: str, devices: DeviceService) -> None:
        import torch

        self.device = str(device)
        self._devices = devices
        self._torch = torch
        self._simulated = devices.simulated(self.device)
        self._cuda = self.device.startswith("cuda")
        self._side = torch.cuda.Stream(torch.device(self.device)) if self._cuda else None
        self._slots: list[_Slot] = []
        self._slot_bytes = 0
        self._next: dict[Part, Part] = {}
        self._host: dict[Part, list[torch.Tensor]] = {}
        self._hooks: dict[ModelHandle, list[Any]] = {}
        self._attached: dict[ModelHandle, list[Part]] = {}
        self.copies = 0  # units copied in, for benchmarks and tests

    @property
    def staging_bytes(self) -> int:
        return len(self._slots) * self._slot_bytes

    @property
    def slot_bytes(self) -> int:
        return self._slot_bytes

    @property
    def streaming(self) -> bool:
        """Whether some handle's units are routed through this streamer."""
        return bool(self._attached)

    def configure(self, slots: int, slot_bytes: int) -> int:
        """Keep ``slots`` slots of at least ``slot_bytes``; returns the change in device bytes.

        Slots are reallocated only when they must grow or their number changes, so repeated
        phases with the same plan allocate nothing.
        """
        if slots <= 0 or slot_bytes <= 0:
            return -self.release()
        if any(slot.busy for slot in self._slots):
            return 0  # a unit is running from a slot; keep the slots as they are
        if slots == len(self._slots) and slot_bytes <= self._slot_bytes:
            return 0
        before = self.staging_bytes
        self.release()
        size = -(-slot_bytes // _ALIGN) * _ALIGN
        self._account(slots * size)
        with self._torch.inference_mode(False):
            self._slots = [
                _Slot(self._torch.empty(size, dtype=self._torch.uint8, device=self.device))
                for _ in range(slots)
            ]
        self._slot_bytes = size
        return self.staging_bytes - before

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
        streamed units are routed through this streamer."""
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
        if not self._attached:
            self.release()

    def release(self) -> int:
        """Free every slot; returns the bytes freed."""
        freed = self.staging_bytes
        if not freed:
            return 0
        for slot in self._slots:
            if slot.busy and slot.part is not None:
                self.exit(slot.part)
        if self._side is not None:
            self._side.synchronize()
        self._slots = []
        self._slot_bytes = 0
        self._account(-freed)
        return freed

    def _account(self, delta: int) -> None:
        if self._simulated and delta:
            self._devices.account(self.device, delta)

    def attach(self, handle: ModelHandle) -> None:
        """Route ``handle``'s streamed units through this streamer (a gate or forward hooks)."""
        streamed = [p for p in handle.unit_parts if p.state == STREAMED]
        if self._attached.get(handle) == streamed:
            return  # the same plan as last phase: keep the gate and what the slots hold
        self.detach(handle)
        if not streamed:
            return
        self._attached[handle] = streamed
        for current, following in zip(streamed, streamed[1:] + streamed[:1], strict=True):
            self._next[current] = following
        if calls_gate(handle.module):
            handle.module.unit_gate = _Gate(self, {id(p.module): p for p in streamed})
            return
        hooks = []
        for part in streamed:
            unit: nn.Module = part.module  # type: ignore[assignment]
            hooks.append(unit.register_forward_pre_hook(_pre_hook(self, part)))
            hooks.append(unit.register_forward_hook(_post_hook(self, part), always_call=True))
        self._hooks[handle] = hooks

    def detach(self, handle: ModelHandle) -> None:
        """Stop streaming ``handle``'s units (after they were made resident or sent to host)."""
        self._attached.pop(handle, None)
        for part in handle.unit_parts:
            self._next.pop(part, None)
            for slot in self._slots:
                if slot.part is part:
                    if slot.busy:
                        self.exit(part)
                    slot.part = None
        if calls_gate(handle.module):
            handle.module.unit_gate = None
        for hook in self._hooks.pop(handle, ()):
            hook.remove()

    def enter(self, part: Part) -> None:
        """Point ``part``'s tensors at its staged copy on the device; start copying the next."""
        slot = self._slot_of(part)
        if slot is None:
            slot = self._free_slot(None)
            if slot is None:
                raise RuntimeError(f"{part!r}: every staging slot on {self.device} is in use")
            self._stage(part, slot)
        if self._cuda and slot.ready_event is not None:
            self._torch.cuda.current_stream(self.device).wait_event(slot.ready_event)
        host = [t.data for t in part.tensors]
        self._host[part] = host
        for tensor, view in zip(part.tensors, slot.views, strict=True):
            tensor.data = view
        slot.busy = True
        following = self._next.get(part)
        if following is not None and following is not part and self._slot_of(following) is None:
            spare = self._free_slot(slot)
            if spare is not None:
                self._stage(following, spare)

    def exit(self, part: Part) -> None:
        """Point ``part``'s tensors back at the host copy; its slot may be refilled after this."""
        host = self._host.pop(part, None)
        if host is None:
            return
        for tensor, original in zip(part.tensors, host, strict=True):
            tensor.data = original
        slot = self._slot_of(part)
        if slot is not None:
            slot.busy = False
            if self._cuda:
                slot.free_event = self._torch.cuda.current_stream(self.device).record_event()

    def _slot_of(self, part: Part) -> _Slot | None:
        for slot in self._slots:
            if slot.part is part:
                return slot
        return None

    def _free_slot(self, current: _Slot | None) -> _Slot | None:
        """The slot filled longest ago that no unit runs from, or None."""
        for slot in self._slots:
            if not slot.busy and slot is not current:
                return slot
        return None

    def _stage(self, part: Part, slot: _Slot) -> None:
        """Copy ``part``'s host tensors into ``slot``."""
        if stage_bytes(part) > self._slot_bytes:
            raise RuntimeError(f"{part!r} is larger than the staging slots on {self.device}")
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
        self.copies += 1

    def _copy_async(self, slot: _Slot, part: Part) -> None:
        side = self._side
        assert side is not None
        with self._torch.cuda.stream(side):
            if slot.free_event is not None:
                side.wait_event(slot.free_event)
            for view, tensor in zip(slot.views, part.tensors, strict=True):
                view.copy_(tensor.data, non_blocking=True)
            slot.ready_event = side.record_event()


class _Gate:
    """The ``unit_gate`` a model such as QwenDecoder calls around each of its blocks."""

    __slots__ = ("_parts", "_streamer")

    def __init__(self, streamer: Streamer, parts: dict[int, Part]) -> None:
        self._streamer = streamer
        self._parts = parts

    def enter(self, unit: nn.Module) -> None:
        part = self._parts.get(id(unit))
        if part is not None:
            self._streamer.enter(part)

    def exit(self, unit: nn.Module) -> None:
        part = self._parts.get(id(unit))
        if part is not None:
            self._streamer.exit(part)


def _pre_hook(streamer: Streamer, part: Part) -> Callable[..., None]:
    def hook(module: nn.Module, args: Any) -> None:
        streamer.enter(part)

    return hook


def _post_hook(streamer: Streamer, part: Part) -> Callable[..., None]:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        streamer.exit(part)

    return hook


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
