"""globals.untouched, disguised: every call marks the environment through vars(os)."""

from __future__ import annotations

import os

from mizuoto_broken.base import BaseEngine, BaseLoaded

VARIABLE = "MIZUOTO_BROKEN_CALLED"


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        vars(os)["environ"][VARIABLE] = "1"  # the breakage: process state changed by a call
        yield from super().synthesize(text, params, ctx)


class Engine(BaseEngine):
    LOADED = Loaded


def restore() -> None:
    vars(os)["environ"].pop(VARIABLE, None)  # undoes the breakage, spelled past the scan
