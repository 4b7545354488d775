"""text_input.abandoned: waits for more text without checking the call's cancel; it gives up
only after GIVE_UP_SECONDS without a piece, longer than the contract's bound."""

from __future__ import annotations

import queue

from mizuoto_broken.base import BaseEngine, BaseLoaded
from mizuoto_runtime.text import split_sentences

GIVE_UP_SECONDS = 4.0


class Loaded(BaseLoaded):
    def streamed_words(self, text, ctx):
        pending = text
        while True:
            try:  # the breakage: no ctx.check_cancel() while it waits
                piece = ctx.text_input.get(timeout=GIVE_UP_SECONDS)
            except queue.Empty:
                piece = None
            if piece is None:
                break
            *finished, pending = split_sentences(pending + piece)
            for sentence in finished:
                yield from sentence.split()
        yield from pending.split()


class Engine(BaseEngine):
    LOADED = Loaded
