"""determinism.seed_matters: says stochastic, but draws from a generator of its own seeded 0."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine, BaseLoaded


class Loaded(BaseLoaded):
    def generator(self, ctx):
        import torch

        return torch.Generator(device=self.device).manual_seed(0)


class Engine(BaseEngine):
    LOADED = Loaded
