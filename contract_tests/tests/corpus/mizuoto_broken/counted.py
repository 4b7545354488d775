"""The good engine, counting its loads and unloads in this process: the suite must unload every
model it loads, or what an engine frees at unload piles up unseen between checks."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine, BaseLoaded

LOADS = [0]
UNLOADS = [0]


class Loaded(BaseLoaded):
    def unload(self) -> None:
        UNLOADS[0] += 1
        super().unload()


class Engine(BaseEngine):
    LOADED = Loaded

    def load(self, spec, runtime, ctx):
        LOADS[0] += 1
        return super().load(spec, runtime, ctx)
