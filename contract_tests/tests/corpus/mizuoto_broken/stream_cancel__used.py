"""stream.cancel (and stream.timeout): once a call has run to its end, later calls take a
"warm" path that renders every word first and never calls ctx.check_cancel(). On a freshly
loaded model every stop works."""

from __future__ import annotations

from mizuoto_broken.base import SAMPLE_RATE, BaseEngine, BaseLoaded
from mizuoto_sdk import AudioChunk

BREAKS = ("stream.cancel", "stream.timeout")


class Loaded(BaseLoaded):
    def __init__(self, device, model):
        super().__init__(device, model)
        self.warm = False

    def synthesize(self, text, params, ctx):
        words = self.words(text)
        generator = self.generator(ctx)
        if self.warm:  # the breakage: the warm path never looks at the context
            for word in words:
                yield AudioChunk(self.render(word, generator), SAMPLE_RATE, {"word": word})
            return
        for word in words:
            ctx.check_cancel()
            yield AudioChunk(self.render(word, generator), SAMPLE_RATE, {"word": word})
        self.warm = True


class Engine(BaseEngine):
    LOADED = Loaded
