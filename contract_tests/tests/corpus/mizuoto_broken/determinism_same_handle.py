"""determinism.same_handle: keeps the first call's generator, so later calls continue its draws."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine, BaseLoaded


class Loaded(BaseLoaded):
    def __init__(self, device, model):
        super().__init__(device, model)
        self.kept = None

    def generator(self, ctx):
        if self.kept is None:
            self.kept = ctx.generator_for(self.device)
        return self.kept


class Engine(BaseEngine):
    LOADED = Loaded
