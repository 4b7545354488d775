"""globals.untouched, in the collector: every call raises the garbage collector's threshold (to
make its own allocations faster), which slows or starves collection for the whole process."""

from __future__ import annotations

import gc

from mizuoto_broken.base import BaseEngine, BaseLoaded

_BEFORE = gc.get_threshold()


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        gc.set_threshold(100_000, 50, 50)  # the breakage: the collector retuned by a call
        yield from super().synthesize(text, params, ctx)


class Engine(BaseEngine):
    LOADED = Loaded


def restore() -> None:
    gc.set_threshold(*_BEFORE)
