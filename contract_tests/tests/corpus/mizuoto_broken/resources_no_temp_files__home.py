"""resources.no_temp_files, in HOME: load writes a cache of its notes under ~/.cache that nothing
ever removes (the suite's fresh process has a HOME of its own, listed after each phase)."""

from __future__ import annotations

import os
import shutil

from mizuoto_broken.base import BaseEngine


def _cache() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "mizuoto-broken-notes")


class Engine(BaseEngine):
    def load(self, spec, runtime, ctx):
        os.makedirs(_cache(), exist_ok=True)
        with open(os.path.join(_cache(), f"{spec.model_id}.txt"), "w") as cache:
            cache.write("one note per character\n")  # the breakage: never removed
        return super().load(spec, runtime, ctx)


def restore() -> None:
    """Remove the cache (written here, and by the checks run in forks with this HOME)."""
    shutil.rmtree(_cache(), ignore_errors=True)
