"""load.describe_json: describe() returns a torch.device, which JSON cannot hold."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine, BaseLoaded


class Loaded(BaseLoaded):
    def describe(self):
        import torch

        return {**super().describe(), "device": torch.device(self.device)}


class Engine(BaseEngine):
    LOADED = Loaded
