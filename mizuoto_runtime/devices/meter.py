"""Memory meters: one object per device that knows how its memory is counted.

The memory manager, the model handles, the streamer and the peak measurements ask a device's
meter (``DeviceService.meter(device)``) and nothing else; none of them asks what kind of device
it is. Three kinds:

- ``AllocatorMeter``: an accelerator (CUDA, ROCm, XPU, MPS). torch's allocator counts every
  allocation itself, so ``charge`` records nothing; free, allocated and peak come from torch.
- ``HostMeter``: a plain CPU. Memory is not scarce there: the manager moves nothing and
  measures nothing.
- ``CountingMeter``: a simulated device (``DeviceService(simulate={"cpu": bytes})``). Tensors
  stay in host memory, so every byte placed "on the device" is counted by ``charge``, which
  fails over the total with ``torch.OutOfMemoryError`` exactly as an allocation would.
"""

from __future__ import annotations

import os
import threading

from mizuoto_sdk.manifest import device_type

__all__ = ["AllocatorMeter", "CountingMeter", "HostMeter", "MemoryMeter", "meter_for"]


class MemoryMeter:
    """How one device's memory is counted. Subclasses answer for one kind of device.

    ``scarce``: memory is planned for and accounted (the manager places, evicts and streams).
    ``measures_peak``: ``peak``/``reset_peak`` measure what a phase allocated.
    ``exclusive``: only this process's accounted placements use the memory (no other
    processes, no allocator fragmentation), so no headroom needs keeping back.
    """

    scarce = True
    measures_peak = True
    exclusive = False

    def __init__(self, device: str) -> None:
        self.device = str(device)

    def memory(self) -> tuple[int, int]:
        """(free, total) bytes."""
        raise NotImplementedError

    def allocated(self) -> int:
        """Bytes in use on the device now."""
        free, total = self.memory()
        return total - free

    def peak(self) -> int:
        """The most bytes in use since ``reset_peak`` (``allocated`` where none is kept)."""
        return self.allocated()

    def reset_peak(self) -> int:
        """Start a new peak from what is in use now; returns that."""
        return self.allocated()

    def charge(self, delta: int) -> None:
        """``delta`` bytes were placed on (negative: removed from) the device by moving tensors.

        Called before bytes arrive, so that an allocation that would fail fails first. Where an
        allocator counts its own allocations this records nothing.
        """

    def __repr__(self) -> str:
        free, total = self.memory()
        return f"<{type(self).__name__} {self.device}: {free} of {total} B free>"


class HostMeter(MemoryMeter):
    """A plain CPU: memory is not scarce; nothing is placed or measured."""

    scarce = False
    measures_peak = False

    def memory(self) -> tuple[int, int]:
        page = os.sysconf("SC_PAGE_SIZE")
        total = page * os.sysconf("SC_PHYS_PAGES")
        try:
            with open("/proc/meminfo", encoding="ascii") as meminfo:
                for line in meminfo:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024, total
        except OSError:
            pass
        return page * os.sysconf("SC_AVPHYS_PAGES"), total


class AllocatorMeter(MemoryMeter):
    """An accelerator whose torch allocator counts (and fails) every allocation itself."""

    def __init__(self, device: str) -> None:
        import torch

        super().__init__(device)
        self._kind = device_type(self.device)
        self._torch = torch
        self._backend = getattr(torch, self._kind)
        self.measures_peak = self._kind != "mps"  # MPS keeps no peak counter

    def memory(self) -> tuple[int, int]:
        """On CUDA, memory the allocator caches but does not use counts as free."""
        backend = self._backend
        if self._kind == "mps":
            total = int(backend.recommended_max_memory())
            return total - int(backend.current_allocated_memory()), total
        free, total = backend.mem_get_info(self._torch.device(self.device))
        cached = backend.memory_reserved(self.device) - backend.memory_allocated(self.device)
        return int(free + cached), int(total)

    def allocated(self) -> int:
        if self._kind == "mps":
            return int(self._backend.current_allocated_memory())
        return int(self._backend.memory_allocated(self.device))

    def peak(self) -> int:
        if not self.measures_peak:
            return self.allocated()
        return int(self._backend.max_memory_allocated(self.device))

    def reset_peak(self) -> int:
        if self.measures_peak:
            self._backend.reset_peak_memory_stats(self.device)
        return self.allocated()


class CountingMeter(MemoryMeter):
    """A simulated device of ``total`` bytes: host memory that counts as device memory."""

    exclusive = True

    def __init__(self, device: str, total: int) -> None:
        if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
            raise ValueError(f"simulate[{device!r}]: expected a byte count > 0, got {total!r}")
        super().__init__(device)
        self.total = total
        self._held = 0
        self._peak = 0
        self._lock = threading.Lock()  # taken last (after the manager's and a streamer's)

    def memory(self) -> tuple[int, int]:
        with self._lock:
            return self.total - self._held, self.total

    def peak(self) -> int:
        with self._lock:
            return self._peak

    def reset_peak(self) -> int:
        with self._lock:
            self._peak = self._held
            return self._held

    def charge(self, delta: int) -> None:
        """Count ``delta`` bytes; over the total, raise ``torch.OutOfMemoryError`` and count
        nothing, so out-of-memory handling runs for real on the CPU."""
        with self._lock:
            held = self._held + delta
            if not (delta > 0 and held > self.total):
                self._held = held
                self._peak = max(self._peak, held)
                return
        import torch

        raise torch.OutOfMemoryError(
            f"simulated {self.device} out of memory: tried to allocate {delta} bytes with "
            f"{self.total - held + delta} of {self.total} free"
        )


def meter_for(device: str, simulated_total: int | None = None) -> MemoryMeter:
    """The meter for ``device``: counting when it is simulated, else by its kind."""
    if simulated_total is not None:
        return CountingMeter(device, simulated_total)
    if device_type(device) == "cpu":
        return HostMeter(device)
    return AllocatorMeter(device)
