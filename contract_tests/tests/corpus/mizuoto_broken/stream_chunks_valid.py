"""stream.chunks_valid: ends every stream with an empty chunk as an end marker."""

from __future__ import annotations

import numpy as np

from mizuoto_broken.base import SAMPLE_RATE, BaseEngine, BaseLoaded
from mizuoto_sdk import AudioChunk


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        yield from super().synthesize(text, params, ctx)
        yield AudioChunk(np.zeros(0, np.float32), SAMPLE_RATE, {"end": True})  # the breakage


class Engine(BaseEngine):
    LOADED = Loaded
