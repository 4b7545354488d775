"""stream.reuse_after_abort: resumes where the last stream of the same request stopped; only a
finished one resets."""

from __future__ import annotations

from mizuoto_broken.base import SAMPLE_RATE, BaseEngine, BaseLoaded
from mizuoto_sdk import AudioChunk


class Loaded(BaseLoaded):
    def __init__(self, device, model):
        super().__init__(device, model)
        self.resume_at: dict[tuple[str, int], int] = {}

    def synthesize(self, text, params, ctx):
        words = self.words(text)
        generator = self.generator(ctx)
        key = (text, ctx.seed)
        for word in words[self.resume_at.get(key, 0) :]:
            ctx.check_cancel()
            self.resume_at[key] = self.resume_at.get(key, 0) + 1
            yield AudioChunk(self.render(word, generator), SAMPLE_RATE, {"word": word})
        self.resume_at[key] = 0  # the breakage: reset when a stream ends, not when one starts


class Engine(BaseEngine):
    LOADED = Loaded
