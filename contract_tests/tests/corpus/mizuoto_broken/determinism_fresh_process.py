"""determinism.fresh_process: picks notes by hash(), which Python salts anew in every process."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine, BaseLoaded


class Loaded(BaseLoaded):
    def steps(self, word):
        return [hash(c) % 24 for c in word]


class Engine(BaseEngine):
    LOADED = Loaded
