"""load.handles_declared, inside a helper: the loaded engine holds a plain helper object (a
callable smoother of its own class) whose torch module is in no handle."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine, BaseLoaded


class _Smoother:
    def __init__(self, layer):
        self.layer = layer

    def __call__(self, samples):
        return self.layer(samples)


class Loaded(BaseLoaded):
    def __init__(self, device, model):
        import torch

        super().__init__(device, model)
        self.smoother = _Smoother(torch.nn.Identity())  # the breakage: not in self.handles


class Engine(BaseEngine):
    LOADED = Loaded
