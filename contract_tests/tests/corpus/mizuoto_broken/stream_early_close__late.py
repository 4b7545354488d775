"""stream.early_close: a scratch buffer taken at the second chunk is "freed" twice when the stream
is closed, so a client that leaves after one chunk is fine and one that leaves later is not."""

from __future__ import annotations

from mizuoto_broken.base import SAMPLE_RATE, BaseEngine, BaseLoaded
from mizuoto_sdk import AudioChunk


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        words = self.words(text)
        generator = self.generator(ctx)
        scratch = None
        try:
            for index, word in enumerate(words):
                if index == 1:
                    scratch = bytearray(16)
                ctx.check_cancel()
                yield AudioChunk(self.render(word, generator), SAMPLE_RATE, {"word": word})
        except GeneratorExit:
            if scratch is not None:  # the breakage: its cleanup fails once there is one
                raise RuntimeError("scratch buffer released twice") from None
            raise


class Engine(BaseEngine):
    LOADED = Loaded
