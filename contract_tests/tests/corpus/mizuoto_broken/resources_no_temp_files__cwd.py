"""resources.no_temp_files, in the working folder: every call writes the text it spoke into a
file of the current folder (a relative path) that nothing removes."""

from __future__ import annotations

import os

from mizuoto_broken.base import BaseEngine, BaseLoaded

SPOKEN = "mizuoto-broken-last-spoken.txt"


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        with open(SPOKEN, "w") as spoken:  # the breakage: never removed
            spoken.write(text)
        yield from super().synthesize(text, params, ctx)


class Engine(BaseEngine):
    LOADED = Loaded


def restore() -> None:
    """Remove the file (written here, and by the checks run in forks of this folder)."""
    if os.path.exists(SPOKEN):
        os.remove(SPOKEN)
