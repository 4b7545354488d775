"""text_input.before_the_end: reads the text input to its end before it sings a word."""

from __future__ import annotations

import queue

from mizuoto_broken.base import BaseEngine, BaseLoaded


class Loaded(BaseLoaded):
    def streamed_words(self, text, ctx):
        while True:  # the breakage: every piece first, however long the text takes to come
            ctx.check_cancel()
            try:
                piece = ctx.text_input.get(timeout=0.02)
            except queue.Empty:
                continue
            if piece is None:
                break
            text += piece
        return iter(self.words(text))


class Engine(BaseEngine):
    LOADED = Loaded
