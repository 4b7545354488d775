"""stream.chunks_valid: from the third chunk on, the sample rate halves."""

from __future__ import annotations

from mizuoto_broken.base import SAMPLE_RATE, BaseEngine, BaseLoaded
from mizuoto_sdk import AudioChunk


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        generator = self.generator(ctx)
        for index, word in enumerate(self.words(text)):
            ctx.check_cancel()
            rate = SAMPLE_RATE if index < 2 else SAMPLE_RATE // 2  # the breakage
            yield AudioChunk(self.render(word, generator), rate, {"word": word})


class Engine(BaseEngine):
    LOADED = Loaded
