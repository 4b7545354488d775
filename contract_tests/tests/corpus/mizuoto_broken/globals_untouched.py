"""globals.untouched: every call adds a handler to a logger and never removes it."""

from __future__ import annotations

import logging

from mizuoto_broken.base import BaseEngine, BaseLoaded

CALLS = logging.getLogger("mizuoto_broken.calls")


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        CALLS.addHandler(logging.NullHandler())  # the breakage: process state changed by a call
        yield from super().synthesize(text, params, ctx)


class Engine(BaseEngine):
    LOADED = Loaded


def restore() -> None:
    """Remove the handlers the calls added."""
    for handler in list(CALLS.handlers):
        CALLS.removeHandler(handler)
