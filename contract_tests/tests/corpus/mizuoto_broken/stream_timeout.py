"""stream.timeout: reports a timeout as a plain cancel."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine, BaseLoaded
from mizuoto_sdk import CancelledError, OperationTimeoutError


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        try:
            yield from super().synthesize(text, params, ctx)
        except OperationTimeoutError:
            raise CancelledError("stopped", {"reason": "cancelled"}) from None  # the breakage


class Engine(BaseEngine):
    LOADED = Loaded
