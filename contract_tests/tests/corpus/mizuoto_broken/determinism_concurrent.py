"""determinism.concurrent: the request's generator is parked on the loaded model, so two calls
at once draw from each other's."""

from __future__ import annotations

from mizuoto_broken.base import SAMPLE_RATE, BaseEngine, BaseLoaded
from mizuoto_sdk import AudioChunk


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        words = self.words(text)
        self.current = self.generator(ctx)  # the breakage: per-call state on the shared model
        for word in words:
            ctx.check_cancel()
            yield AudioChunk(self.render(word, self.current), SAMPLE_RATE, {"word": word})


class Engine(BaseEngine):
    LOADED = Loaded
