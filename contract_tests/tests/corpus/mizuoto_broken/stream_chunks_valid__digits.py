"""stream.chunks_valid, off the sample text: a word with a digit in it is read by a path whose
normalisation divides by zero, and its chunk is NaN. The suite's three sentences have none."""

from __future__ import annotations

from mizuoto_broken.base import SAMPLE_RATE, BaseEngine, BaseLoaded
from mizuoto_sdk import AudioChunk


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        words = self.words(text)
        generator = self.generator(ctx)
        for word in words:
            ctx.check_cancel()
            samples = self.render(word, generator)
            if any(c.isdigit() for c in word):
                samples = samples / 0.0 * 0.0  # the breakage: NaN for words with digits
            yield AudioChunk(samples, SAMPLE_RATE, {"word": word})


class Engine(BaseEngine):
    LOADED = Loaded
