"""Routing: the healthy replica with the fewest requests in flight, round robin on ties."""

from __future__ import annotations

import threading

import pytest

from mizuoto_sdk.errors import EngineUnavailable
from mizuoto_sdk.serving.routing import ReplicaStatus, Router


class Replica:
    def __init__(self, healthy: bool = True, in_flight: int = 0) -> None:
        self.healthy = healthy
        self.in_flight = in_flight

    def reserve(self) -> None:
        self.in_flight += 1


def test_ties_take_turns_and_the_least_loaded_replica_wins():
    replicas = [Replica(), Replica(), Replica()]
    router = Router(replicas, "x")
    assert [router.pick() for _ in range(3)] == [0, 1, 2]
    replicas[0].in_flight = replicas[2].in_flight = 5
    assert router.pick() == 1
    assert replicas[1].in_flight == 2


def test_requests_that_finish_are_routed_round_robin():
    replicas = [Replica(), Replica()]
    router = Router(replicas, "x")
    picks = []
    for _ in range(4):
        index = router.pick()
        picks.append(index)
        replicas[index].in_flight -= 1  # the request ended before the next one came
    assert picks == [0, 1, 0, 1]


def test_unhealthy_replicas_are_skipped_and_none_left_is_engine_unavailable():
    replicas = [Replica(healthy=False), Replica()]
    router = Router(replicas, "x")
    assert {router.pick() for _ in range(3)} == {1}
    replicas[1].healthy = False
    with pytest.raises(EngineUnavailable) as caught:
        router.pick()
    assert caught.value.detail == {"engine": "x", "reason": "no_healthy_replica"}
    assert "restart = on_failure" in str(caught.value)


def test_concurrent_picks_spread_evenly():
    replicas = [Replica() for _ in range(4)]
    router = Router(replicas, "x")
    start = threading.Barrier(8)

    def client() -> None:
        start.wait()
        for _ in range(50):
            router.pick()

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [r.in_flight for r in replicas] == [100, 100, 100, 100]


def test_a_status_as_dict_is_json_ready():
    status = ReplicaStatus(1, True, 2, ("cuda:0", "cuda:1"), (11, 12), "ready")
    assert status.as_dict() == {
        "id": 1,
        "healthy": True,
        "in_flight": 2,
        "devices": ["cuda:0", "cuda:1"],
        "pids": [11, 12],
        "state": "ready",
        "failure": None,
    }
