"""resources.unload_releases: a module-level cache keeps the last loaded model alive."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine

_CACHE: dict[str, object] = {}


class Engine(BaseEngine):
    def load(self, spec, runtime, ctx):
        loaded = super().load(spec, runtime, ctx)
        _CACHE[spec.model_id] = loaded  # the breakage: nothing ever drops it
        return loaded


def restore() -> None:
    """Drop the cached model."""
    _CACHE.clear()
