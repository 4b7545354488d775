"""resources.unload_releases: a module-level list keeps a layer of the model, reached only
through LoadedEngine.handles, alive after unload."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine

_LAYERS: list[object] = []


class Engine(BaseEngine):
    def load(self, spec, runtime, ctx):
        loaded = super().load(spec, runtime, ctx)
        _LAYERS.append(loaded.handles[0].loudness)  # the breakage: nothing ever drops it
        return loaded


def restore() -> None:
    _LAYERS.clear()
