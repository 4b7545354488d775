"""Text streamed in to a model served by a worker process (``engines.<id>.replicas``): the pieces
cross to the worker as they come, and the audio is the joined text's, as in this process."""

from __future__ import annotations

import os
import queue
import threading
import time

import numpy as np
import pytest

from mizuoto_sdk import EngineError
from mizuoto_sdk.host import EngineRequest, RuntimeService

TEXT = "Hello big world. Then one more! Last words"


def test_a_worker_speaks_streamed_text_as_it_comes_and_ends_with_a_cancel():
    with RuntimeService() as inline:
        want = [
            c.samples
            for c in inline.load("sine").synthesize(TEXT, EngineRequest(params={"seed": 2}))
        ]
    with RuntimeService({"engines.sine.replicas": 2}) as service:
        served = service.load("sine")
        assert os.getpid() not in [pid for r in served.replicas for pid in r.pids]  # workers
        feed: queue.Queue[str | None] = queue.Queue()
        stream = served.synthesize(TEXT[:4], EngineRequest(params={"seed": 2}, text_input=feed))
        feed.put(TEXT[4:18])  # "o big world. T": the first sentence is finished
        first = [next(stream).samples for _ in range(3)]  # before the rest of the text came
        for piece in (TEXT[18:33], TEXT[33:], None):
            feed.put(piece)
        got = first + [c.samples for c in stream]
        assert np.array_equal(np.concatenate(got), np.concatenate(want))

        request = EngineRequest(params={"seed": 2}, text_input=queue.Queue())
        waiting = served.synthesize("Never", request)
        threading.Timer(0.2, request.cancel).start()
        started = time.perf_counter()
        with pytest.raises(EngineError) as caught:
            list(waiting)
        assert caught.value.code == "cancelled"
        assert time.perf_counter() - started < 5
