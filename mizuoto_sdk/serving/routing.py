"""Which replica takes a request: the healthy one with the fewest in flight, round robin on ties."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

import attrs

from mizuoto_sdk.errors import EngineUnavailable


@attrs.frozen
class ReplicaStatus:
    """One replica as ``handle.replicas`` and ``mizuoto runtime`` show it.

    ``state`` is ``"stopped"`` (not started yet, or closed), ``"starting"``, ``"ready"``,
    ``"failed"`` (``failure`` says why) or ``"restarting"``. A replica that has not started yet
    counts as healthy: startup is lazy.
    """

    id: int
    healthy: bool
    in_flight: int
    devices: tuple[str, ...]
    pids: tuple[int, ...]
    state: str = "ready"
    failure: str | None = None

    def as_dict(self) -> dict[str, object]:
        return attrs.asdict(self, recurse=False, value_serializer=_listed)


def _listed(instance: object, field: object, value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


class Routable(Protocol):
    """What routing asks of a replica."""

    @property
    def healthy(self) -> bool: ...

    @property
    def in_flight(self) -> int: ...

    def reserve(self) -> None:
        """Count one more request in flight (routing calls it under its lock)."""


class Router:
    """Sends each request whole to one replica; a stream stays on the replica it started on.

    ``pick`` chooses and reserves under one lock, so concurrent callers see each other's choice
    and spread out instead of all taking the same idle replica.
    """

    def __init__(self, replicas: Sequence[Routable], engine_id: str) -> None:
        self._replicas = tuple(replicas)
        self._engine_id = engine_id
        self._lock = threading.Lock()
        self._turn = 0

    def pick(self) -> int:
        """The index of the replica that takes the next request, already reserved for it."""
        with self._lock:
            healthy = [i for i, replica in enumerate(self._replicas) if replica.healthy]
            if not healthy:
                raise EngineUnavailable(
                    f"{self._engine_id}: no healthy replica is left "
                    f"(all {len(self._replicas)} failed); set engines.{self._engine_id}.restart "
                    "= on_failure to restart failed replicas, or load the model again",
                    {"engine": self._engine_id, "reason": "no_healthy_replica"},
                )
            fewest = min(self._replicas[i].in_flight for i in healthy)
            tied = [i for i in healthy if self._replicas[i].in_flight == fewest]
            # round robin among the tied: the first at or after the turn, wrapping around
            chosen = min(tied, key=lambda i: (i - self._turn) % len(self._replicas))
            self._turn = (chosen + 1) % len(self._replicas)
            self._replicas[chosen].reserve()
            return chosen
