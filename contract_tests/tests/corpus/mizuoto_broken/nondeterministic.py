"""The good engine on a backend it cannot make reproducible: its jitter comes from the operating
system, not the seed. It declares ``deterministic=False`` and must pass every other check."""

from __future__ import annotations

import secrets

from mizuoto_broken.base import BaseEngine, BaseLoaded


class Loaded(BaseLoaded):
    def generator(self, ctx):
        import torch

        return torch.Generator(device=self.device).manual_seed(secrets.randbits(63))


class Engine(BaseEngine):
    LOADED = Loaded
