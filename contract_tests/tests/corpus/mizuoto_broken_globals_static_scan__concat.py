"""globals.static_scan, spelled as strings: a debugging option seeds torch's global generator
through a name built by concatenation (``getattr(torch, "manual_" + "seed")``), on a path that no
other check reaches. The scan folds the string, as the fresh process's diff would see the seed.

It lives outside the mizuoto_broken package for the reason mizuoto_broken_static.py does.
"""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine


class Engine(BaseEngine):
    def load(self, spec, runtime, ctx):
        if spec.options.get("debug_seed") is not None:
            import torch

            getattr(torch, "manual_" + "seed")(int(spec.options["debug_seed"]))  # the breakage
        return super().load(spec, runtime, ctx)
