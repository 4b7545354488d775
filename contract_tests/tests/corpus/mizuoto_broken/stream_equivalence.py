"""stream.equivalence: keeps the request's generator per thread, so a stream whose chunks are
pulled from different threads (a server's thread pool) restarts its draws on each."""

from __future__ import annotations

import threading
import weakref

from mizuoto_broken.base import BaseEngine, BaseLoaded


class Loaded(BaseLoaded):
    def __init__(self, device, model):
        super().__init__(device, model)
        self.local = threading.local()

    def generator(self, ctx):
        return _PerThread(self, ctx)

    def render(self, word, generator):
        return super().render(word, generator.get())


class _PerThread:
    """Looks like the request's generator; really one per (thread, request)."""

    def __init__(self, loaded, ctx):
        self.loaded, self.ctx = loaded, ctx

    def get(self):
        import torch

        local = self.loaded.local
        if not hasattr(local, "generators"):
            local.generators = weakref.WeakKeyDictionary()
        if self.ctx not in local.generators:  # the breakage: a new generator on each thread
            seeded = torch.Generator(device=self.loaded.device).manual_seed(self.ctx.seed)
            local.generators[self.ctx] = seeded
        return local.generators[self.ctx]


class Engine(BaseEngine):
    LOADED = Loaded
