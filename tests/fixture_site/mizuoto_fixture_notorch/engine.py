"""The ``notorch`` engine: a chunk per word, each one a child process's float32 PCM on stdout.

The child draws a seeded tone (its pitch from the request's seed and the word), so a seed decides
the output and another seed changes it. ``runtime`` is never touched: a torch-free engine is given
one that refuses every use (load option ``use_runtime`` shows that).
"""

import sys

import numpy as np

from mizuoto_sdk import AudioChunk, Engine, InvalidRequest, LoadedEngine

SAMPLE_RATE = 16_000

# Prints 0.1 s of a tone as raw little-endian float32 samples: what a command-line synthesizer
# writing to stdout looks like to an engine.
_CHILD = """
import math, struct, sys
frequency = float(sys.argv[1])
n = 1600
sys.stdout.buffer.write(struct.pack("<%df" % n,
    *(0.2 * math.sin(2 * math.pi * frequency * i / 16000) for i in range(n))))
"""


class NoTorchEngine(Engine):
    def load(self, spec, runtime, ctx):
        if spec.options.get("use_runtime"):  # an engine that declares too little
            runtime.manager  # noqa: B018 - the use is the point
        return Loaded(spec)


class Loaded(LoadedEngine):
    def __init__(self, spec):
        self.spec = spec
        # An engine that declares uses_torch=False and still lists a handle is refused.
        self.handles = [object()] if spec.options.get("list_handle") else []

    def describe(self):
        return {"model": self.spec.model_id, "uses_torch": False}

    def synthesize(self, text, params, ctx):
        if not text.strip():
            raise InvalidRequest("text: is empty", {"field": "text"})
        for word in text.split():
            ctx.check_cancel()
            frequency = 200 + int(ctx.rng.integers(0, 400)) + len(word)
            done = ctx.run_process(
                [sys.executable, "-c", _CHILD, str(frequency)], capture_output=True, check=True
            )
            yield AudioChunk(np.frombuffer(done.stdout, dtype="<f4").copy(), SAMPLE_RATE)
