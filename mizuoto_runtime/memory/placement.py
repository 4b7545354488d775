"""DevicePlacement: one device's residency: what sits on it, and what moves to make room.

The manager keeps the registry, the phases and the out-of-memory ladder, and decides when memory
moves. Each device it places on has a ``DevicePlacement`` that owns what that device needs to
decide what moves: its meter (how its memory is counted), its policy (headroom, staging slots),
its streamer (staging slots and copies) and the entries of the handles loaded there. It answers:
how much room a phase has (free memory plus what the phase already holds there, less headroom,
working memory and base parameters), which idle units give memory back first (least recently
used, cheapest to reload), and which of a phase's units stay resident while the rest stream.

Every method runs under the manager's lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mizuoto_runtime.devices.device import is_oom
from mizuoto_runtime.memory.handle import HOST, RESIDENT, ModelHandle
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
    from mizuoto_runtime.devices.meter import MemoryMeter
    from mizuoto_runtime.memory.occupancy import Entry

__all__ = ["DevicePlacement"]


class DevicePlacement:
    """The handles on one device, its meter, policy and streamer; places and evicts there."""

    def __init__(self, meter: MemoryMeter, policy: VramPolicy, calibration: Calibration) -> None:
        self.device = meter.device
        self.meter, self.policy, self.calibration = meter, policy, calibration
        self.streamer = Streamer(meter)
        self.entries: list[Entry] = []

    def admit(self, entry: Entry) -> None:
        """Track a newly registered handle and charge its moves to the device's meter.

        The engine's load put the handle's resident bytes on the device. Where the allocator
        counted them then, charging them records nothing. A simulated device counts them now;
        when they do not fit, idle handles give memory back, then the new handle's parts that
        still do not fit go to host memory, the base last (a load is never refused).
        """
        self.entries.append(entry)
        handle = entry.handle
        if not self.meter.scarce:
            return
        resident = [p for p in handle.parts if p.state == RESIDENT]
        released = False
        while True:
            try:
                self.meter.charge(handle.resident_bytes)
                break
            except Exception as error:
                if not is_oom(error):
                    raise
            if not released:
                released = True
                self.release(handle.resident_bytes - self.meter.memory()[0], keep=[handle])
            else:
                handle.move(resident.pop(), HOST)  # not bound yet: the meter is not charged
        handle.bind(self.meter)

    def forget(self, entry: Entry) -> None:
        """Stop tracking ``entry``; its resident bytes are no longer charged to the device."""
        handle = entry.handle
        self.streamer.detach(handle)
        if self.meter.scarce:
            self.meter.charge(-handle.resident_bytes)
            handle.bind(None)
        self.entries.remove(entry)

    def release(self, need: int | None, keep: Sequence[ModelHandle] = ()) -> list[str]:
        """Idle handles, all but ``keep``, give back resident parts until ``need`` bytes (all:
        None); returns the names of those that gave memory back."""
        if not self.meter.scarce:
            return []
        idle = [e for e in self.entries if not e.busy and e.handle not in keep]
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
        had = handle.resident_bytes > 0
        for part in handle.parts:
            handle.move(part, HOST)
        self.streamer.detach(handle)
        return had

    def place(self, handles: list[ModelHandle], plan: Plan) -> None:
        """Place a phase's ``handles`` on this device; the level chosen goes in ``plan``."""
        policy, streamer = self.policy, self.streamer
        key = Calibration.key([h.name for h in handles], self.device, plan.phase, plan.shape)
        weights = sum(h.size_bytes for h in handles)
        need = policy.working(plan.working_bytes, self.calibration.get(key), weights)
        limit, slots = plan.cap.get(self.device, (None, policy.in_flight))
        units = unit_order(handles)
        sizes = [p.nbytes for p in units]
        slot_bytes = max((stage_bytes(p) for p in units), default=0)
        plan.working[self.device] = (need, key)
        missing_base = sum(h.base.nbytes for h in handles if h.base.state != RESIDENT)

        def room() -> int:
            free, _ = self.meter.memory()
            ours = sum(p.nbytes for p in units if p.state == RESIDENT) + streamer.staging_bytes
            return free + ours - policy.headroom - need - missing_base

        available = room()
        if available < sum(sizes):
            self.release(sum(sizes) - available, keep=handles)
            available = room()
        if limit is not None:
            available = min(available, limit)
        chosen, used_slots = choose_resident(sizes, available, slot_bytes, slots)
        placed = sum(sizes[i] for i in chosen) + used_slots * slot_bytes
        streamed = len(units) - len(chosen)
        plan.levels[self.device] = Level(placed, slots, slot_bytes, len(chosen), streamed)
        kept = {id(units[i]) for i in chosen}
        streamer.apply(
            handles,
            [units[i] for i in chosen],
            [p for p in units if id(p) not in kept],
            used_slots,
            max(slot_bytes, streamer.slot_bytes),
        )
