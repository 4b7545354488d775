"""errors.unsupported: looks operations up in a dict, so an unknown one raises KeyError."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine, BaseLoaded


class Loaded(BaseLoaded):
    def call(self, op, payload, ctx):
        operations = {"count_words": lambda: {"words": len(str(payload.get("text", "")).split())}}
        return operations[op]()  # the breakage: KeyError instead of Unsupported


class Engine(BaseEngine):
    LOADED = Loaded
