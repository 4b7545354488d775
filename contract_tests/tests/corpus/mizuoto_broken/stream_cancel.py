"""stream.cancel: turns the CancelledError of ctx.check_cancel() into a RuntimeError."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine, BaseLoaded
from mizuoto_sdk import CancelledError


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        try:
            yield from super().synthesize(text, params, ctx)
        except CancelledError:
            raise RuntimeError("synthesis interrupted") from None  # the breakage


class Engine(BaseEngine):
    LOADED = Loaded
