"""determinism.concurrent: a lock taken when a stream starts and released when it ends, so a
second call at once waits for a stream that is waiting, at its next chunk, for that call.

Serial calls never see it; two streams pulled in turn (the suite's lock step, or a server pulling
two clients' streams from one event loop) hang for good.
"""

from __future__ import annotations

import threading

from mizuoto_broken.base import SAMPLE_RATE, BaseEngine, BaseLoaded
from mizuoto_sdk import AudioChunk

_ONE_STREAM = threading.Lock()


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        words = self.words(text)
        generator = self.generator(ctx)
        with _ONE_STREAM:  # the breakage: held across every yield of the stream
            for word in words:
                ctx.check_cancel()
                yield AudioChunk(self.render(word, generator), SAMPLE_RATE, {"word": word})


class Engine(BaseEngine):
    LOADED = Loaded
