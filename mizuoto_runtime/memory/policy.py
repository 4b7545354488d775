"""VramPolicy: how much of a device the planner may fill, and what a phase needs besides weights.

No magic factor per model: working memory starts from the engine's estimate (``working_bytes``,
e.g. ``lm.memory.peak_bytes``) or a share of the weights, and is replaced by what the phase was
measured to need: the peak allocation above the placed weights, per model set, device, phase
and shape bucket, times a margin. A phase that ran out of memory doubles its figure, so the next
request plans with more room instead of failing the same way. The numbers come from the compute
settings (``ComputeSettings``) each time a model loads; the measurements (``Calibration``) outlive
the policy.

Settings (all optional; None takes the default):

- ``compute.vram_headroom_mb``: memory always left free on a device for other processes and
  the allocator's fragmentation. Default: 5 % of the device, at most 1 GiB; 0 on a simulated one.
- ``compute.stream_in_flight``: streamed units staged at once (default 2: the one running and
  the next, copied while the first computes). 1 disables prefetch; more hides slower links.
- ``compute.working_margin``: factor on measured peaks (default 1.25).
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

from mizuoto_sdk.compute import ComputeSettings

if TYPE_CHECKING:
    from mizuoto_runtime.devices.device import DeviceService
    from mizuoto_runtime.memory.handle import ModelHandle, Part

__all__ = [
    "Calibration",
    "Level",
    "PeakMeter",
    "Plan",
    "SettingsLike",
    "VramPolicy",
    "choose_resident",
    "compute_of",
    "eviction_order",
    "failing_device",
    "shape_bucket",
    "spread",
    "unit_order",
]

_GPU_INDEX = re.compile(r"GPU (\d+)")
_MIB = 2**20
_HEADROOM_SHARE = 0.05
_HEADROOM_CAP = 1024 * _MIB
_UNKNOWN_WORKING_SHARE = 0.1  # of the weights, for a phase nobody estimated or measured yet


class HasCompute(Protocol):
    """Anything that holds the current compute settings: the host's ``Settings``, a context."""

    @property
    def compute(self) -> ComputeSettings: ...


# What the runtime may be given: the typed value, a live source of it (read again at each load, so
# a changed setting applies to the next model), or dotted settings (``{"compute.x": ...}``).
SettingsLike = ComputeSettings | HasCompute | Mapping[str, object]


def compute_of(settings: SettingsLike | None) -> ComputeSettings:
    """The compute settings ``settings`` holds now (the defaults for None)."""
    if settings is None:
        return ComputeSettings()
    if isinstance(settings, ComputeSettings):
        return settings
    if isinstance(settings, Mapping):
        return ComputeSettings.from_settings(settings)
    return settings.compute


@dataclass(frozen=True)
class VramPolicy:
    """The planner's numbers for one device.

    ``headroom``: bytes never planned for; ``in_flight``: staging slots for streamed units;
    ``margin``: factor on measured working peaks.
    """

    headroom: int = 0
    in_flight: int = 2
    margin: float = 1.25

    @classmethod
    def from_settings(
        cls, settings: SettingsLike | None, *, total: int, simulated: bool = False
    ) -> VramPolicy:
        """The policy the compute settings give for a device of ``total`` bytes."""
        compute = compute_of(settings)
        headroom_mb, in_flight = compute.vram_headroom_mb, compute.stream_in_flight
        margin = compute.working_margin
        if headroom_mb is None:
            headroom = 0 if simulated else min(int(total * _HEADROOM_SHARE), _HEADROOM_CAP)
        else:
            headroom = int(headroom_mb * _MIB)
        return cls(
            headroom=headroom,
            in_flight=2 if in_flight is None else int(in_flight),
            margin=1.25 if margin is None else float(margin),
        )

    def working(self, estimate: int | None, measured: int | None, weights: int) -> int:
        """Bytes a phase needs beyond its weights: measured x margin, else the estimate."""
        if measured is not None:
            return max(int(measured * self.margin), estimate or 0)
        if estimate is not None:
            return int(estimate)
        return int(weights * _UNKNOWN_WORKING_SHARE)

    def ladder(self, level: Level) -> tuple[int, int] | None:
        """The next (unit bytes at most, staging slots) after an out-of-memory, or None.

        Each step halves the device bytes the units may take (resident units plus staging
        slots), down to every unit streamed; then prefetch is dropped (one slot); then the
        ladder ends. Halving bytes rather than counting units makes every step free memory.
        """
        floor = level.slots * level.slot_bytes  # every unit streamed through these slots
        if level.unit_bytes > floor:
            return max(level.unit_bytes // 2, floor), level.slots
        if level.slots > 1:
            return level.slot_bytes, 1
        return None


class Level(NamedTuple):
    """What placement put on one device for a phase."""

    unit_bytes: int  # resident units plus staging slots
    slots: int  # staging slots (the ladder's, even when nothing streamed)
    slot_bytes: int
    resident_units: int
    streamed_units: int


class Calibration:
    """Measured working peaks, per (models, device, phase, shape bucket): they outlive policies.

    A measurement replaces the guess an out-of-memory left (twice what was planned), so one
    failure makes the next request plan with more room and its success sets the real figure.
    """

    def __init__(self) -> None:
        self._measured: dict[tuple[object, ...], int] = {}
        self._guessed: dict[tuple[object, ...], int] = {}

    @staticmethod
    def key(
        names: Sequence[str], device: str, phase: str, shape: Sequence[int] | None
    ) -> tuple[object, ...]:
        return (tuple(sorted(names)), device, phase, shape_bucket(shape))

    def get(self, key: tuple[object, ...]) -> int | None:
        guess, measured = self._guessed.get(key), self._measured.get(key)
        return guess if guess is not None and guess > (measured or 0) else measured

    def record(self, key: tuple[object, ...], peak: int) -> None:
        """Keep the largest peak measured (one small run does not shrink a phase's need)."""
        if peak >= 0:
            self._measured[key] = max(self._measured.get(key, 0), int(peak))
            self._guessed.pop(key, None)

    def failed(self, key: tuple[object, ...], planned: int) -> None:
        """A phase planned with ``planned`` working bytes ran out of memory: guess double."""
        self._guessed[key] = max(self._guessed.get(key, 0), 2 * int(planned))

    def __len__(self) -> int:
        return len(self._measured.keys() | self._guessed.keys())


class _Reading:
    __slots__ = ("baseline", "device", "key", "read", "valid")

    def __init__(self, device: str, key: tuple[object, ...], read: Callable[[bool], int]) -> None:
        self.device, self.key, self.read, self.valid = device, key, read, True
        self.baseline = read(True)


class PeakMeter:
    """Measures a phase's peak allocation above what was held when it began, per device.

    The device's meter keeps the peak (torch's allocator on CUDA, the counter on a simulated
    device); a phase resets it and reads it back. Phases nest (a host-level phase around an
    engine's): a nested reset voids the outer reading, so the innermost phase's measurement is
    the one kept.
    """

    def __init__(self, devices: DeviceService, calibration: Calibration) -> None:
        self._devices = devices
        self._calibration = calibration
        self._open: dict[str, list[_Reading]] = {}
        self._lock = threading.Lock()  # guards _open; phases of several threads overlap

    @contextlib.contextmanager
    def measure(self, keys: dict[str, tuple[object, ...]]) -> Iterator[None]:
        """Record into the calibration, for each device, the block's peak under ``keys[device]``.

        Overlapping phases (nested, or on other threads) share the device's peak counter, so
        a reset voids every reading still open on that device: only a phase that ran alone
        there leaves a measurement.
        """
        readings: list[_Reading] = []
        with self._lock:
            for device, key in keys.items():
                read = self._reader(device)
                if read is None:
                    continue
                stack = self._open.setdefault(device, [])
                for outer in stack:
                    outer.valid = False
                reading = _Reading(device, key, read)
                stack.append(reading)
                readings.append(reading)
        try:
            yield
            with self._lock:
                for reading in readings:
                    if reading.valid:
                        peak = reading.read(False) - reading.baseline
                        self._calibration.record(reading.key, peak)
        finally:
            with self._lock:
                for reading in readings:
                    self._open[reading.device].remove(reading)

    def _reader(self, device: str) -> Callable[[bool], int] | None:
        """``read(reset)``: with reset, restart the peak and return what is held; else the peak."""
        meter = self._devices.meter(device)
        if not meter.measures_peak:
            return None
        return lambda reset: meter.reset_peak() if reset else meter.peak()


class Plan:
    """One attempt at a phase: what it asked for and what placement chose on each device.

    ``cap`` (device -> (unit bytes at most, staging slots)) is the retry ladder's step,
    carried from attempt to attempt; ``levels`` what was placed, ``working`` the working bytes
    planned and the calibration key they were looked up under.
    """

    def __init__(
        self,
        phase: str,
        working_bytes: int | None = None,
        shape: Sequence[int] | None = None,
        cap: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        self.phase, self.working_bytes, self.shape = phase, working_bytes, shape
        self.cap: dict[str, tuple[int, int]] = {} if cap is None else cap
        self.levels: dict[str, Level] = {}
        self.working: dict[str, tuple[int, tuple[object, ...]]] = {}

    def retry(self) -> Plan:
        return Plan(self.phase, self.working_bytes, self.shape, self.cap)

    def keys(self) -> dict[str, tuple[object, ...]]:
        return {device: key for device, (_, key) in self.working.items()}

    def summary(self) -> dict[str, object]:
        return {
            device: {"resident": level.resident_units, "streamed": level.streamed_units}
            for device, level in self.levels.items()
        }


def unit_order(handles: Sequence[ModelHandle]) -> list[Part]:
    """The order units are kept resident in: sequence models first (their units run once per
    token, so streaming them costs most), each model's units spread (see ``spread``)."""
    ordered = sorted(handles, key=lambda h: h.kind != "sequence")
    return [h.unit_parts[i] for h in ordered for i in spread(len(h.unit_parts))]


def eviction_order(candidates: Sequence[tuple[int, Part]]) -> list[Part]:
    """Idle parts (with their handle's last-use tick) in the order they give memory back.

    Least recently used first; one-shot models before sequence models; within a handle its
    units before its base; cheapest to reload first.
    """
    ranked = sorted(
        candidates,
        key=lambda tp: (
            tp[0],
            tp[1].handle.kind == "sequence",
            not tp[1].streamable,
            tp[1].handle.reload_cost(tp[1]),
        ),
    )
    return [part for _, part in ranked]


def failing_device(error: str, candidates: Sequence[str]) -> str:
    """Which of ``candidates`` an out-of-memory message names (CUDA says "GPU <n>")."""
    match = _GPU_INDEX.search(error)
    if match is not None and f"cuda:{match.group(1)}" in candidates:
        return f"cuda:{match.group(1)}"
    named = [d for d in candidates if d in error]
    return (named or list(candidates))[0]


def choose_resident(
    sizes: Sequence[int], room: int, slot_bytes: int, slots: int
) -> tuple[list[int], int]:
    """Which units (indexes into ``sizes``, taken in that order) stay resident, and the slots.

    ``room`` is what the device has for units after the base and working memory. All units stay
    resident when they fit; otherwise ``slots`` staging slots of ``slot_bytes`` come off the
    room first and units are kept in order while they fit. Taking a prefix keeps the choice
    monotone: more room never keeps fewer units.
    """
    if sum(sizes) <= room:
        return list(range(len(sizes))), 0
    left = room - slots * slot_bytes
    chosen: list[int] = []
    for index, size in enumerate(sizes):
        if size > left:
            break
        left -= size
        chosen.append(index)
    return chosen, min(slots, len(sizes) - len(chosen))


def spread(count: int) -> list[int]:
    """0 .. count - 1 in an order whose every prefix is spread evenly (bit-reversed fractions).

    Keeping a prefix of this order resident leaves the streamed units between resident ones,
    so each copy overlaps the compute of the unit before it.
    """

    def fraction(index: int) -> float:
        value, scale = 0.0, 0.5
        while index:
            value += scale * (index & 1)
            index >>= 1
            scale /= 2
        return value

    return sorted(range(count), key=fraction)


def shape_bucket(shape: Sequence[int] | None) -> tuple[int, ...] | None:
    """Each dimension rounded up to a power of two, so similar requests share a measurement."""
    if shape is None:
        return None
    return tuple(1 << max(0, math.ceil(math.log2(max(int(d), 1)))) for d in shape)
