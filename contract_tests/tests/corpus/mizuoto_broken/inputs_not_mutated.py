"""inputs.not_mutated: writes its defaults into the caller's params dict."""

from __future__ import annotations

from collections.abc import MutableMapping

from mizuoto_broken.base import BaseEngine, BaseLoaded


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        if isinstance(params, MutableMapping):
            params.setdefault("speed", 1.0)  # the breakage: the caller's dict changes
        yield from super().synthesize(text, params, ctx)


class Engine(BaseEngine):
    LOADED = Loaded
