"""resources.no_processes, daemonised: every call starts a helper through a shell that puts it
in the background and exits at once, so the helper is nobody's child (a double fork)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from mizuoto_broken.base import BaseEngine, BaseLoaded

_STARTED: list[int] = []
_HELPER = "sleep 30 </dev/null >/dev/null 2>&1 & echo $!"


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        shell = subprocess.run(["sh", "-c", _HELPER], capture_output=True, text=True, check=True)
        _STARTED.append(int(shell.stdout))  # the breakage: the helper is never stopped
        yield from super().synthesize(text, params, ctx)


class Engine(BaseEngine):
    LOADED = Loaded


def restore() -> None:
    """Stop the helpers this process started (by pid; whoever adopted them reaps them)."""
    while _STARTED:
        with contextlib.suppress(OSError):
            os.kill(_STARTED.pop(), signal.SIGKILL)
