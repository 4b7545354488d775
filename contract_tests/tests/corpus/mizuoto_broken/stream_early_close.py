"""stream.early_close: flushes a tail chunk when closed, i.e. yields after GeneratorExit."""

from __future__ import annotations

import numpy as np

from mizuoto_broken.base import SAMPLE_RATE, BaseEngine, BaseLoaded
from mizuoto_sdk import AudioChunk


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        for chunk in super().synthesize(text, params, ctx):
            try:
                yield chunk
            except GeneratorExit:
                # The breakage: close() raises RuntimeError. Closed again (when collected), the
                # generator ends at this yield, so nothing is left running.
                yield AudioChunk(np.zeros(160, np.float32), SAMPLE_RATE, {"tail": True})
                return


class Engine(BaseEngine):
    LOADED = Loaded
