"""load.global_state: loading adds a handler to a library's logger; only unload removes it."""

from __future__ import annotations

import logging

from mizuoto_broken.base import BaseEngine, BaseLoaded

CHATTY = logging.getLogger("mizuoto_broken.chatty")


class Loaded(BaseLoaded):
    def __init__(self, device, model):
        super().__init__(device, model)
        self.quiet = logging.NullHandler()
        CHATTY.addHandler(self.quiet)  # the breakage: process state changed by load

    def unload(self):
        CHATTY.removeHandler(self.quiet)
        super().unload()


class Engine(BaseEngine):
    LOADED = Loaded


def restore() -> None:
    """Remove the handlers of the models that were never unloaded."""
    for handler in list(CHATTY.handlers):
        CHATTY.removeHandler(handler)
