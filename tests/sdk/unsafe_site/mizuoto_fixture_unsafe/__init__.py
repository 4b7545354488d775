"""An engine around a "library" with one global buffer, as a C library with static state has.

Each call writes its text into the buffer chunk by chunk and reads it back; a second call inside
at the same time overwrites it, and the first then yields the other's samples. ``INSIDE`` counts
the calls inside the library now and ``MOST`` the most there ever were. ``unsafe`` declares
``max_concurrency=1``; ``unsafe-unlimited`` is the same engine declaring nothing.
"""

import threading

import numpy as np

from mizuoto_sdk import (
    AudioChunk,
    Engine,
    EngineManifest,
    InvalidRequest,
    LoadedEngine,
    ModelEntry,
    hookimpl,
)

BUFFER = np.zeros(4, np.float32)  # the library's global state
INSIDE = [0]
MOST = [0]
_count = threading.Lock()
_crowd = threading.Condition()


class UnsafeEngine(Engine):
    DEVICES = ("cpu",)

    def load(self, spec, runtime, ctx):
        return _Loaded()


def _enter() -> None:
    with _count:
        INSIDE[0] += 1
        MOST[0] = max(MOST[0], INSIDE[0])
    with _crowd:
        _crowd.notify_all()
        # Stay a while, or until another call comes in: overlap shows whenever it can happen.
        _crowd.wait_for(lambda: INSIDE[0] > 1, timeout=0.05)


def _leave() -> None:
    with _count:
        INSIDE[0] -= 1


class _Loaded(LoadedEngine):
    def synthesize(self, text, params, ctx):
        if not text.strip():
            raise InvalidRequest("text: expected some words", {"field": "text"})
        value = float(len(text) + (params.get("seed") or 0))
        for _ in range(3):
            BUFFER[:] = value  # into the library's one buffer ...
            _enter()  # ... where another call, inside at the same time, overwrites it
            try:
                ctx.check_cancel()
                samples = BUFFER.copy()
            finally:
                _leave()
            yield AudioChunk(samples, 16000)


def _manifest(engine_id, max_concurrency):
    return EngineManifest(
        id=engine_id,
        implementation="mizuoto_fixture_unsafe:UnsafeEngine",
        models=[ModelEntry("a")],
        capabilities=["synthesize"],
        devices=["cpu"],
        uses_torch=False,
        max_concurrency=max_concurrency,
    )


@hookimpl
def mizuoto_engines():
    return [_manifest("unsafe", 1), _manifest("unsafe-unlimited", None)]
