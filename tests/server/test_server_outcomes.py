"""The record of how recent syntheses ended, written by many request handlers at once."""

from __future__ import annotations

import threading

from mizuoto_sdk.server.outcomes import Outcomes


def record(outcomes: Outcomes, count: int, into: list[str]) -> None:
    for index in range(count):
        request_id = outcomes.begin("sine")
        outcomes.end(request_id, "done" if index % 2 else "failed", chunks=index)
        into.append(request_id)


def test_many_threads_at_once_keep_every_request_apart_and_exactly_the_newest() -> None:
    outcomes = Outcomes(kept=1000)
    ids: list[list[str]] = [[] for _ in range(8)]
    threads = [threading.Thread(target=record, args=(outcomes, 500, ids[i])) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [request_id for mine in ids for request_id in mine]
    assert len(set(every)) == 4000
    kept = 0
    for mine in ids:
        for index, request_id in enumerate(mine):
            entry = outcomes.get(request_id)
            if entry is None:
                continue
            kept += 1
            assert (entry["state"], entry["chunks"]) == ("done" if index % 2 else "failed", index)
    assert kept == 1000


def test_only_the_newest_are_kept_and_a_copy_is_handed_out() -> None:
    outcomes = Outcomes(kept=3)
    ids = [outcomes.begin("sine") for _ in range(5)]
    assert [outcomes.get(i) is not None for i in ids] == [False, False, True, True, True]
    entry = outcomes.get(ids[-1])
    assert entry is not None and entry["state"] == "streaming"
    entry["state"] = "changed by a caller"
    assert outcomes.get(ids[-1])["state"] == "streaming"  # type: ignore[index]
    outcomes.end(ids[0], "done")  # forgotten already: nothing to update, no error
    assert outcomes.get(ids[0]) is None
