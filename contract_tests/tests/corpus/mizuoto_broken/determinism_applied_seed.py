"""determinism.applied_seed: a request without a seed gets a seed the engine picks itself, which
no one is told; seeded requests are reproducible, unseeded takes are lost."""

from __future__ import annotations

import secrets

from mizuoto_broken.base import BaseEngine, BaseLoaded


class Loaded(BaseLoaded):
    def generator(self, ctx):
        import torch

        if ctx.params.get("seed") is not None:
            return ctx.generator_for(self.device)
        # the breakage: its own seed, unreported, instead of the host's reported one
        return torch.Generator(device=self.device).manual_seed(secrets.randbits(63))


class Engine(BaseEngine):
    LOADED = Loaded
