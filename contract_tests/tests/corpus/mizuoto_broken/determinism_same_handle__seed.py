"""determinism.same_handle: for one seed in fourteen (13, 27, ... below a thousand), the jitter
comes from a generator of the engine's own, seeded from the clock, instead of the request's."""

from __future__ import annotations

import time

from mizuoto_broken.base import BaseEngine, BaseLoaded


class Loaded(BaseLoaded):
    def generator(self, ctx):
        import torch

        if ctx.seed < 1000 and ctx.seed % 14 == 13:
            # the breakage: a seed of its own for this one
            return torch.Generator(device=self.device).manual_seed(time.perf_counter_ns())
        return super().generator(ctx)


class Engine(BaseEngine):
    LOADED = Loaded
