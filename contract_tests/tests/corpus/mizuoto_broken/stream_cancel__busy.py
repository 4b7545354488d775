"""stream.cancel (and stream.timeout): one chunk for the whole text, from a step that, once
stopped, goes on for seconds without reaching ctx.check_cancel().

Uninterrupted, the step takes a fraction of a second; a stop during it finds an engine that
"flushes" for 2.5 s and then returns its chunk as if nothing happened.
"""

from __future__ import annotations

import time

import numpy as np

from mizuoto_broken.base import SAMPLE_RATE, BaseEngine, BaseLoaded
from mizuoto_sdk import AudioChunk

BREAKS = ("stream.cancel", "stream.timeout")
STEP_SECONDS = 0.12
FLUSH_SECONDS = 2.1


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        words = self.words(text)
        generator = self.generator(ctx)
        ctx.check_cancel()
        parts = [self.render(word, generator).numpy() for word in words]
        ends = time.monotonic() + STEP_SECONDS
        while time.monotonic() < ends:  # the slow part of the step
            if ctx.cancelled:
                ends = time.monotonic() + FLUSH_SECONDS  # the breakage: never check_cancel()
                ctx.wait_cancelled(0.01)
                while time.monotonic() < ends:
                    time.sleep(0.01)
                break
            time.sleep(0.01)
        yield AudioChunk(np.concatenate(parts), SAMPLE_RATE)


class Engine(BaseEngine):
    LOADED = Loaded
