"""stream.generator: returns a hand-written iterator (lazy, closable), not a generator."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine, BaseLoaded


class _Chunks:
    """Iterates and closes the good stream: it works, but it is not a generator."""

    def __init__(self, stream):
        self._stream = stream

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._stream)

    def close(self):
        self._stream.close()


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        return _Chunks(super().synthesize(text, params, ctx))


class Engine(BaseEngine):
    LOADED = Loaded
