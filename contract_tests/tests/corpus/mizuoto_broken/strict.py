"""A good engine that refuses params it does not know, as a careful author writes it: it must
pass every check (the suite sends only what an engine can expect)."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine, BaseLoaded
from mizuoto_sdk import InvalidRequest

KNOWN = frozenset({"seed"})


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        unknown = sorted(set(params) - KNOWN)
        if unknown:
            raise InvalidRequest(f"params: unknown {unknown}", {"field": "params"})
        yield from super().synthesize(text, params, ctx)


class Engine(BaseEngine):
    LOADED = Loaded
