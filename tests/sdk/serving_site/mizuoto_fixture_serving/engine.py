"""The ``faulty`` engine: seeded noise in chunks, and a fault wherever a request asks for one.

Serving tests run it in worker processes and make it fail the ways a real engine can: the process
exits, a step hangs (deaf to cancel, or listening for it), a step is slow, the engine refuses the
request or has a bug. Every sample comes from ``ctx.rng`` (numpy, seeded by the request), so one
seed gives the same bytes in any process. Chunk metadata carries the pid that computed it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from mizuoto_sdk import AudioChunk, Engine, InvalidRequest, LoadedEngine

SAMPLE_RATE = 16_000
LOAD_FAULTS = ("exit", "raise")


class FaultyEngine(Engine):
    def load(self, spec, runtime, ctx):
        options = spec.options
        time.sleep(float(options.get("load_delay", 0)))
        fault = options.get("fault_on_load")
        if fault == "exit":
            os._exit(5)  # deliberate: the worker dies while loading
        if fault == "raise":
            raise RuntimeError("load failed on purpose")
        if fault is not None:
            raise InvalidRequest(
                f"options.fault_on_load: expected one of {', '.join(LOAD_FAULTS)}, got {fault!r}",
                {"field": "options.fault_on_load"},
            )
        return LoadedFaulty(spec.device)


class LoadedFaulty(LoadedEngine):
    def __init__(self, device: str) -> None:
        self.device = device

    def describe(self) -> Mapping[str, object]:
        return {"pid": os.getpid(), "device": self.device}

    def synthesize(self, text, params, ctx) -> Iterator[AudioChunk]:
        try:
            for index in range(params["chunks"]):
                _before_chunk(index, params, ctx, field="text")
                samples = ctx.rng.standard_normal(params["chunk_samples"], dtype=np.float32)
                yield AudioChunk(0.1 * samples, SAMPLE_RATE, {"pid": os.getpid(), "index": index})
        finally:
            _mark(params, "finally", os.getpid())

    def convert(self, audio, params, ctx) -> Iterator[AudioChunk]:
        samples = np.asarray(audio.samples, dtype=np.float32)
        pieces = np.array_split(samples, params["chunks"], axis=-1)
        for index, piece in enumerate(pieces):
            _before_chunk(index, params, ctx, field="audio")
            yield AudioChunk(piece, audio.sample_rate, {"pid": os.getpid(), "index": index})

    def prepare_voice(self, audio, voice_dir, params, ctx) -> Mapping[str, object]:
        voice = {"samples": int(np.asarray(audio.samples).shape[-1])}
        Path(voice_dir).mkdir(parents=True, exist_ok=True)
        (Path(voice_dir) / "voice.json").write_text(json.dumps(voice))
        return voice

    def call(self, op, payload, ctx) -> object:
        if op == "pid":
            return {"pid": os.getpid()}
        if op == "echo":
            return dict(payload)
        if op == "sleep":
            seconds = payload.get("seconds")
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
                raise InvalidRequest(
                    f"payload.seconds: expected a number >= 0, got {seconds!r}",
                    {"field": "payload.seconds"},
                )
            _sleep(ctx, seconds)
            return {"slept": seconds}
        if op == "exit":
            os._exit(4)  # deliberate: the worker dies in the middle of a call
        raise InvalidRequest(
            f"op: expected one of pid, echo, sleep, exit, got {op!r}", {"field": "op"}
        )


def _sleep(ctx, seconds: float) -> None:
    """Wait ``seconds``, stopping early (CancelledError / OperationTimeoutError) on cancel."""
    ctx.wait_cancelled(seconds)
    ctx.check_cancel()


def _before_chunk(index: int, params, ctx, field: str) -> None:
    """What runs before each chunk: the cancel check, and the request's fault at chunk ``at``."""
    fault = params["fault"]
    if fault == "slow":
        _sleep(ctx, params["delay"])
    ctx.check_cancel()
    if index != params["at"]:
        return
    if fault == "exit":
        os._exit(3)  # deliberate: the worker dies mid-stream
    if fault == "hang":
        while True:  # deliberate: a real hang, deaf to cancel; only killing the process ends it
            time.sleep(0.05)
    if fault == "hang_cancellable":
        while not ctx.wait_cancelled(0.05):  # stuck, but stops at cancel or the request timeout
            pass
        ctx.check_cancel()
    if fault == "child":  # a child that lives while the step waits for cancel, then dies
        with ctx.open_process(["sleep", "60"]) as child:
            _mark(params, "child", child.pid)
            while not ctx.wait_cancelled(0.05):
                pass
        ctx.check_cancel()
    if fault == "invalid":
        raise InvalidRequest(f"{field}: refused on purpose (fault=invalid)", {"field": field})
    if fault == "crash":
        raise RuntimeError("crashed on purpose (fault=crash)")


def _mark(params, name: str, pid: int) -> None:
    """Write ``<marker>/<name>.pid`` (whole, by a rename) when the request names a marker folder."""
    if params["marker"]:
        folder = Path(params["marker"])
        (folder / f"{name}.tmp").write_text(str(pid))
        (folder / f"{name}.tmp").replace(folder / f"{name}.pid")
