"""resources.no_processes: every call starts a helper program and neither kills nor reaps it."""

from __future__ import annotations

import subprocess
import sys

from mizuoto_broken.base import BaseEngine, BaseLoaded

_STARTED: list[subprocess.Popen] = []


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        _STARTED.append(helper)  # the breakage: never killed, never waited for
        yield from super().synthesize(text, params, ctx)


class Engine(BaseEngine):
    LOADED = Loaded


def restore() -> None:
    """Stop the helpers this process started."""
    while _STARTED:
        helper = _STARTED.pop()
        helper.kill()
        helper.wait()
