"""Placement: which of a phase's units sit on the device, and which idle units make room for them.

The manager decides when memory moves: a phase starts, a retry steps down the ladder, a handle is
registered or unloaded. This module decides what moves, and keeps that byte arithmetic apart from
the phase and retry flow: how much room a device has for a phase (free memory plus what the phase
already holds there, less headroom, working memory and base parameters), which idle units give
memory back first (least recently used, cheapest to reload), and which of the phase's units stay
resident while the rest are streamed through staging slots.

``Placer`` keeps no state of its own: it reads the manager's tracked entries and asks the manager
for each device's policy and streamer. Its callers hold the manager's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from mizuoto_runtime.memory.handle import HOST, RESIDENT, ModelHandle
from mizuoto_runtime.memory.occupancy import Entry
from mizuoto_runtime.memory.policy import (
    Calibration,
    Level,
    Plan,
    VramPolicy,
    choose_resident,
    eviction_order,
    unit_order,
)
from mizuoto_runtime.memory.stream import Streamer, stage_bytes

if TYPE_CHECKING:
    from mizuoto_runtime.devices.device import DeviceService

__all__ = ["Entry", "Placer"]


class Placer:
    """Places a phase's handles device by device and evicts idle ones to make room."""

    def __init__(
        self,
        devices: DeviceService,
        calibration: Calibration,
        entries: Mapping[ModelHandle, Entry],
        policy: Callable[[str], VramPolicy],
        streamer: Callable[[str], Streamer],
    ) -> None:
        self.devices, self.calibration = devices, calibration
        self._entries, self._policy, self._streamer = entries, policy, streamer

    def place(self, entries: Sequence[Entry], plan: Plan) -> None:
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
            self._place_device(device, handles, plan)

    def release(self, device: str, need: int | None, keep: Sequence[ModelHandle] = ()) -> list[str]:
        """Idle handles on ``device`` give back resident parts until ``need`` bytes (all: None)."""
        idle = [
            e
            for e in self._entries.values()
            if e.scarce and not e.busy and e.handle.load_device == device
            if e.handle not in keep
        ]
        parts = eviction_order([(e.tick, p) for e in idle for p in e.handle.parts])
        freed, names = 0, []
        for part in parts:
            if need is not None and freed >= need:
                break
            if part.state == RESIDENT:
                part.handle.move(part, HOST)
                freed += part.nbytes
                names.append(part.handle.name)
        if need is None:  # streamed parts too, so the staging slots can go
            names += [e.handle.name for e in idle if self.offload(e.handle)]
        return list(dict.fromkeys(names))

    def offload(self, handle: ModelHandle) -> bool:
        """Every part of ``handle`` to host memory; whether it had any on the device."""
        had = handle.loaded_bytes > 0
        for part in handle.parts:
            handle.move(part, HOST)
        self._streamer(handle.load_device).detach(handle)
        return had

    def admit(self, handle: ModelHandle) -> None:
        """Count a new handle resident on a simulated device, making room as placement would."""
        device = handle.load_device
        free = self.devices.memory(device)[0]
        if handle.loaded_bytes > free:
            self.release(device, handle.loaded_bytes - free, keep=[handle])
        self.devices.account(device, handle.fit_into(self.devices.memory(device)[0]))

    def _place_device(self, device: str, handles: list[ModelHandle], plan: Plan) -> None:
        policy, streamer = self._policy(device), self._streamer(device)
        key = Calibration.key([h.name for h in handles], device, plan.phase, plan.shape)
        weights = sum(h.size_bytes for h in handles)
        need = policy.working(plan.working_bytes, self.calibration.get(key), weights)
        limit, slots = plan.cap.get(device, (None, policy.in_flight))
        units = unit_order(handles)
        sizes = [p.nbytes for p in units]
        slot_bytes = max((stage_bytes(p) for p in units), default=0)
        plan.working[device] = (need, key)
        missing_base = sum(h.base.nbytes for h in handles if h.base.state != RESIDENT)

        def room() -> int:
            free, _ = self.devices.memory(device)
            ours = sum(p.nbytes for p in units if p.state == RESIDENT) + streamer.staging_bytes
            return free + ours - policy.headroom - need - missing_base

        available = room()
        if available < sum(sizes):
            self.release(device, sum(sizes) - available, keep=handles)
            available = room()
        if limit is not None:
            available = min(available, limit)
        chosen, used_slots = choose_resident(sizes, available, slot_bytes, slots)
        placed = sum(sizes[i] for i in chosen) + used_slots * slot_bytes
        streamed = len(units) - len(chosen)
        plan.levels[device] = Level(placed, slots, slot_bytes, len(chosen), streamed)
        kept = {id(units[i]) for i in chosen}
        streamer.apply(
            handles,
            [units[i] for i in chosen],
            [p for p in units if id(p) not in kept],
            used_slots,
            max(slot_bytes, streamer.slot_bytes),
        )
