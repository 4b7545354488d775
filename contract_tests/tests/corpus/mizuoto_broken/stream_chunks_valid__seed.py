"""stream.chunks_valid: for one seed in fourteen (13, 27, ... below a thousand), a note's gain is
divided by a value that is zero, and its samples are NaN. Seed 1234, the one a check speaks with
when it tries a single seed, is fine."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine, BaseLoaded


def unlucky(seed: int) -> bool:
    return seed < 1000 and seed % 14 == 13


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        for chunk in super().synthesize(text, params, ctx):
            if unlucky(ctx.seed):
                chunk.samples[-1] = chunk.samples[-1] / 0.0 * 0.0  # the breakage: NaN
            yield chunk


class Engine(BaseEngine):
    LOADED = Loaded
