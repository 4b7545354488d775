"""determinism.concurrent: the words being spoken are parked on the loaded model, so a call
that starts while another streams speaks on with the other's words from then on.

Two calls at once with one text never see it: the words they swap are the same. Two users'
requests, with two texts, hear each other.
"""

from __future__ import annotations

from mizuoto_broken.base import SAMPLE_RATE, BaseEngine, BaseLoaded
from mizuoto_sdk import AudioChunk


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        self.spoken = self.words(text)  # the breakage: per-call input on the shared model
        generator = self.generator(ctx)
        for index in range(len(self.spoken)):
            ctx.check_cancel()
            word = self.spoken[index % len(self.spoken)]
            yield AudioChunk(self.render(word, generator), SAMPLE_RATE, {"word": word})


class Engine(BaseEngine):
    LOADED = Loaded
