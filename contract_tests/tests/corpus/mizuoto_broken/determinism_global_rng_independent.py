"""determinism.global_rng_independent: adds a dither drawn from torch's global generator.

The draw happens inside ``fork_rng``, so the global state is left as it was: nothing but the
output depends on it.
"""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine, BaseLoaded


class Loaded(BaseLoaded):
    def render(self, word, generator):
        import torch

        samples = super().render(word, generator)
        with torch.random.fork_rng(devices=[]):
            dither = torch.rand(samples.shape, device=self.device)  # the breakage: no generator=
        return samples + 1e-4 * dither


class Engine(BaseEngine):
    LOADED = Loaded
