"""load.describe_json: describe() shows the last call's duration as a numpy float32, which JSON
cannot hold; after load, before any call, it is fine."""

from __future__ import annotations

import numpy as np

from mizuoto_broken.base import BaseEngine, BaseLoaded


class Loaded(BaseLoaded):
    last_seconds = None

    def render(self, word, generator):
        samples = super().render(word, generator)
        self.last_seconds = np.float32(samples.shape[-1] / 16_000)  # the breakage
        return samples

    def describe(self):
        described = dict(super().describe())
        if self.last_seconds is not None:
            described["last_seconds"] = self.last_seconds
        return described


class Engine(BaseEngine):
    LOADED = Loaded
