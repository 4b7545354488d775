"""load.handles_declared: holds a second torch module that it leaves out of handles."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine, BaseLoaded


class Loaded(BaseLoaded):
    def __init__(self, device, model):
        import torch

        super().__init__(device, model)
        self.smoothing = torch.nn.Identity()  # the breakage: not in self.handles


class Engine(BaseEngine):
    LOADED = Loaded
