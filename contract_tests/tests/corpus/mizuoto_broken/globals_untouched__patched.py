"""globals.untouched, by patching: the first call wraps torch.load to default weights_only=False,
so every other engine in the process now unpickles code from its checkpoints."""

from __future__ import annotations

import functools

from mizuoto_broken.base import BaseEngine, BaseLoaded

_ORIGINAL: list[object] = []


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        import torch

        namespace = vars(torch)
        if not _ORIGINAL:
            _ORIGINAL.append(namespace["load"])
            # the breakage: a public function of torch replaced for everyone
            namespace["load"] = functools.partial(namespace["load"], weights_only=False)
        yield from super().synthesize(text, params, ctx)


class Engine(BaseEngine):
    LOADED = Loaded


def restore() -> None:
    if _ORIGINAL:
        import torch

        vars(torch)["load"] = _ORIGINAL.pop()
