"""The ``witness`` engine: silence in chunks, each step written down in the request's ``log`` file.

Lines (appended, one write each): ``child PID`` once the child is started, ``chunk I`` just
before chunk I is yielded (so the count of them is how many chunks the engine computed), and
``finally`` when the stream's cleanup ran, whether it ended, failed, was cancelled or closed.
The cleanup takes ``unwind`` seconds, as an engine's may (a child to wait for, a file to flush):
a host that does not wait for its calls to unwind ends before it is done.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator

import numpy as np

from mizuoto_sdk import AudioChunk, Engine, LoadedEngine

SAMPLE_RATE = 16_000
_SLEEPER = [sys.executable, "-c", "import time; time.sleep(3600)"]


class WitnessEngine(Engine):
    def load(self, spec, runtime, ctx):
        return LoadedWitness()


class LoadedWitness(LoadedEngine):
    def synthesize(self, text, params, ctx) -> Iterator[AudioChunk]:
        log = params["log"]
        try:
            with contextlib.ExitStack() as stack:
                if params["child"]:
                    child = stack.enter_context(ctx.open_process(_SLEEPER))
                    _write(log, f"child {child.pid}")
                for index in range(params["chunks"]):
                    if index == params["hold_at"]:
                        ctx.wait_cancelled()  # in flight until someone cancels the call
                    ctx.check_cancel()
                    _write(log, f"chunk {index}")
                    yield AudioChunk(np.zeros(params["chunk_samples"], np.float32), SAMPLE_RATE)
        finally:
            time.sleep(params["unwind"])
            _write(log, "finally")


def _write(log: str, line: str) -> None:
    if log:
        descriptor = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(descriptor, f"{line}\n".encode())
        finally:
            os.close(descriptor)
