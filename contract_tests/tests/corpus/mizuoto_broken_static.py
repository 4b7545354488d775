"""globals.static_scan: a debugging option seeds torch's global generator, on a path that no
other check reaches.

It lives outside the mizuoto_broken package because the scan reads an implementation's whole
top-level package: inside it, it would break the static scan of every corpus engine.
"""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine


class Engine(BaseEngine):
    def load(self, spec, runtime, ctx):
        if spec.options.get("debug_seed") is not None:
            import torch

            torch.manual_seed(int(spec.options["debug_seed"]))  # allowed: the breakage
        return super().load(spec, runtime, ctx)
