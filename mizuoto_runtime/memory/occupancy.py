"""Occupancy: who uses which handle, and waiting for memory that another thread's phase holds.

The manager keeps an ``Entry`` per handle: the threads whose phases hold it (it is then never
evicted), the threads whose phases run it (it is then never moved, since moving tensors under a
running forward would break it) and the calls holding it between their phases. A ``Lease`` is
one phase's share of that.

When a phase cannot get device memory however far down the retry ladder it goes, the memory may
be held by phases of other threads, which give it back when they end. ``MemoryWaits`` lets the
phase wait for one of them to end, bounded by its call's cancel and timeout, instead of failing;
it fails at once when no other thread holds a handle on the device or every one that does is
waiting too (none of them would ever end). Everything here runs under the manager's lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mizuoto_runtime.context import RequestContext
    from mizuoto_runtime.memory.handle import ModelHandle

__all__ = ["Entry", "Lease", "MemoryWaits"]

_CANCEL_POLL = 0.02  # seconds between cancel checks while waiting (as the host's watcher)


class Entry:
    """One tracked handle: its owner, who is using it, and when it was last used."""

    __slots__ = ("calls", "handle", "holders", "last_used", "owner", "running", "scarce", "tick")

    def __init__(self, handle: ModelHandle, owner: str, scarce: bool) -> None:
        self.handle, self.owner = handle, owner
        self.scarce = scarce  # device memory is accounted (an accelerator or a simulated one)
        self.holders: dict[int, int] = {}  # thread id -> phases holding the handle
        self.running: dict[int, int] = {}  # thread id -> its phases computing with it
        self.calls = 0  # calls holding it between their phases (``hold``)
        self.last_used, self.tick = time.time(), 0

    @property
    def busy(self) -> bool:
        return bool(self.holders) or self.calls > 0


class Lease:
    """One phase's hold on its entries; ``running`` from a placement that went through until
    the attempt fails or the phase ends (in between, its handles may be placed by others)."""

    __slots__ = ("entries", "running", "thread")

    def __init__(self, thread: int) -> None:
        self.thread = thread
        self.entries: list[Entry] = []
        self.running = False

    def hold(self, entry: Entry) -> None:
        entry.holders[self.thread] = entry.holders.get(self.thread, 0) + 1
        self.entries.append(entry)

    def run(self) -> None:
        """From now on no other thread moves these handles (the phase computes with them)."""
        if not self.running:
            self.running = True
            for entry in self.entries:
                entry.running[self.thread] = entry.running.get(self.thread, 0) + 1

    def stop(self) -> None:
        """The phase computes no more (an attempt failed): others may place its handles."""
        if self.running:
            self.running = False
            for entry in self.entries:
                _drop_one(entry.running, self.thread)

    def release(self) -> None:
        self.stop()
        for entry in self.entries:
            _drop_one(entry.holders, self.thread)


class MemoryWaits:
    """Phases waiting for other threads' phases on a device to end; ``lock``: the manager's."""

    def __init__(self, lock: threading.RLock) -> None:
        self._ended = threading.Condition(lock)
        self._ends: dict[str, int] = {}  # device -> phases ended (or memory freed) there
        self._own = threading.local()  # .counts: of those, this thread's, per device
        self._waiting: set[int] = set()

    def mark(self) -> dict[str, int]:
        """What other threads ended or freed so far, per device, to tell later whether they
        did more (a thread's own phases never count: waiting for them would never end)."""
        return {device: self._others(device) for device in self._ends}

    def changed(self, device: str, mark: dict[str, int]) -> bool:
        return self._others(device) != mark.get(device, 0)

    def freed(self, device: str) -> None:
        """Memory on ``device`` was given back: wake whoever waits for it."""
        own = self._counts()
        self._ends[device] = self._ends.get(device, 0) + 1
        own[device] = own.get(device, 0) + 1
        self._ended.notify_all()

    def phase_ended(self, lease: Lease) -> None:
        for device in {e.handle.load_device for e in lease.entries if e.scarce}:
            self.freed(device)

    def _others(self, device: str) -> int:
        return self._ends.get(device, 0) - self._counts().get(device, 0)

    def _counts(self) -> dict[str, int]:
        counts = getattr(self._own, "counts", None)
        if counts is None:
            counts = self._own.counts = {}
        return counts

    @staticmethod
    def yielding(lease: Lease, device: str) -> list[ModelHandle]:
        """The phase's handles on ``device`` that nothing else holds (no other thread, no
        enclosing phase): they give their memory back while the phase waits (its retry places
        them again), so that two phases never wait for each other's memory."""
        alone = {lease.thread: 1}
        return [
            e.handle
            for e in lease.entries
            if e.scarce and e.handle.load_device == device and e.holders == alone
        ]

    def wait(self, entries: Iterable[Entry], device: str, context: RequestContext | None) -> bool:
        """Wait until another thread's phase on ``device`` ends or frees memory; False (at once)
        when none would. ``entries``: every tracked entry, a live view, read on each wake-up.
        Raises the call's ``CancelledError`` or ``OperationTimeoutError`` when it is stopped.
        """
        me = threading.get_ident()
        since = self._others(device)
        if context is not None:
            context.check_cancel()
        self._waiting.add(me)
        try:
            while self._others(device) == since:
                holders = {
                    thread
                    for e in entries
                    if e.scarce and e.handle.load_device == device
                    for thread in e.holders
                }
                if not holders - self._waiting - {me}:
                    return False
                if context is not None:
                    context.check_cancel()
                self._ended.wait(_CANCEL_POLL)
            return True
        finally:
            self._waiting.discard(me)


def _drop_one(counts: dict[int, int], thread: int) -> None:
    count = counts.get(thread, 0) - 1
    if count > 0:
        counts[thread] = count
    else:
        counts.pop(thread, None)
