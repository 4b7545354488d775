"""resources.unload_releases, in a module global: load keeps the checkpoint it built the model
from (its state dict, whose tensors share the weights' memory) in a module-level cache that
unload never clears. The loaded engine and its modules are freed; the weights are not."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine

_CHECKPOINTS: dict[str, object] = {}


class Engine(BaseEngine):
    def load(self, spec, runtime, ctx):
        loaded = super().load(spec, runtime, ctx)
        _CHECKPOINTS[spec.model_id] = loaded.model.state_dict()  # the breakage: never dropped
        return loaded


def restore() -> None:
    _CHECKPOINTS.clear()
