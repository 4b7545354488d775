"""determinism.concurrent: a wrapped native library with one global synthesis context, which
crashes the process when a second call enters it while the first is open.

It stands for a C library such as libespeak-ng called through ctypes: ``_enter`` is its
``synth_begin``, which dereferences a context pointer that a call in flight has taken (here a
null pointer read through ``ctypes.string_at``, a real SIGSEGV). Serial calls never see it.
"""

from __future__ import annotations

import ctypes

from mizuoto_broken.base import SAMPLE_RATE, BaseEngine, BaseLoaded
from mizuoto_sdk import AudioChunk

_CONTEXT = {"open": False}  # the library's global state


def _enter() -> None:
    if _CONTEXT["open"]:
        ctypes.string_at(0)  # the breakage: a second caller reads the context another one took
    _CONTEXT["open"] = True


def _leave() -> None:
    _CONTEXT["open"] = False


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        words = self.words(text)
        generator = self.generator(ctx)
        _enter()
        try:
            for word in words:
                ctx.check_cancel()
                yield AudioChunk(self.render(word, generator), SAMPLE_RATE, {"word": word})
        finally:
            _leave()


class Engine(BaseEngine):
    LOADED = Loaded
