"""resources.reload: keeps the weights it read on the Engine and folds the output gain into
them in place at every load, so the second load of one host folds twice."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine, BaseLoaded


class Engine(BaseEngine):
    def __init__(self) -> None:
        self.weights = None

    def load(self, spec, runtime, ctx):
        import torch

        from mizuoto_broken.model import build

        model = build(spec.device, self.weights_seed())
        if self.weights is None:
            self.weights = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            self.weights["loudness.bias"].add_(0.5)  # the breakage: the cached copy changes
        model.load_state_dict(self.weights)
        return BaseLoaded(spec.device, model)
