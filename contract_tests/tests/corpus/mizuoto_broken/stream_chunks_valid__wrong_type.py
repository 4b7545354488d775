"""stream.chunks_valid: the third chunk is a bare array instead of an AudioChunk."""

from __future__ import annotations

from mizuoto_broken.base import SAMPLE_RATE, BaseEngine, BaseLoaded
from mizuoto_sdk import AudioChunk


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        generator = self.generator(ctx)
        for index, word in enumerate(self.words(text)):
            ctx.check_cancel()
            samples = self.render(word, generator)
            if index == 2:
                yield samples.numpy()  # the breakage: not an AudioChunk
            else:
                yield AudioChunk(samples, SAMPLE_RATE, {"word": word})


class Engine(BaseEngine):
    LOADED = Loaded
