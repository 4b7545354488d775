"""stream.lazy: renders every word before it returns, then hands out the finished chunks."""

from __future__ import annotations

from mizuoto_broken.base import SAMPLE_RATE, BaseEngine, BaseLoaded
from mizuoto_sdk import AudioChunk


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        generator = self.generator(ctx)
        chunks = [  # the breakage: all the work happens before the first next()
            AudioChunk(self.render(word, generator), SAMPLE_RATE, {"word": word})
            for word in self.words(text)
        ]
        return self._hand_out(chunks, ctx)

    def _hand_out(self, chunks, ctx):
        for chunk in chunks:
            ctx.check_cancel()
            yield chunk


class Engine(BaseEngine):
    LOADED = Loaded
