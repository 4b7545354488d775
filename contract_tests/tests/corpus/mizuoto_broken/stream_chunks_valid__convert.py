"""stream.chunks_valid: synthesizes well, but its second capability, convert, yields a chunk at
another sample rate once the input is longer than a few notes. A suite that checks only the
first declared capability never sees it."""

from __future__ import annotations

from mizuoto_broken.base import SAMPLE_RATE, BaseEngine, BaseLoaded
from mizuoto_sdk import AudioChunk, InvalidRequest


class Loaded(BaseLoaded):
    def convert(self, audio, params, ctx):
        if audio.samples.shape[-1] == 0:
            raise InvalidRequest("audio: is empty", {"field": "audio"})
        generator = self.generator(ctx)
        # one note per 1000 input samples, named by their loudness
        count = max(1, audio.samples.shape[-1] // 1000)
        for index in range(count):
            ctx.check_cancel()
            rate = SAMPLE_RATE if index < 3 else SAMPLE_RATE // 2  # the breakage
            yield AudioChunk(self.render("ab", generator), rate)


class Engine(BaseEngine):
    LOADED = Loaded
