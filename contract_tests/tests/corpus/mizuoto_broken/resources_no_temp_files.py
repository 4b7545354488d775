"""resources.no_temp_files: every call writes its text to a temporary file it never removes."""

from __future__ import annotations

import os
import tempfile

from mizuoto_broken.base import BaseEngine, BaseLoaded

_WRITTEN: list[str] = []


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        handle, path = tempfile.mkstemp(prefix="mizuoto-broken-", suffix=".txt")
        with os.fdopen(handle, "w") as file:
            file.write(text)
        _WRITTEN.append(path)  # the breakage: never removed
        yield from super().synthesize(text, params, ctx)


class Engine(BaseEngine):
    LOADED = Loaded


def restore() -> None:
    """Remove the files this process wrote."""
    while _WRITTEN:
        path = _WRITTEN.pop()
        if os.path.exists(path):
            os.remove(path)
