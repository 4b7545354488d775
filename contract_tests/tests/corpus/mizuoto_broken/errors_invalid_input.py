"""errors.invalid_input: empty text gives an empty stream instead of InvalidRequest."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine, BaseLoaded


class Loaded(BaseLoaded):
    def words(self, text):
        return text.split()  # the breakage: no check for empty text


class Engine(BaseEngine):
    LOADED = Loaded
