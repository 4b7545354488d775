"""load.global_state, disguised: importing the engine sets an environment variable through a
spelling no static scan resolves."""

from __future__ import annotations

import os

from mizuoto_broken.base import BaseEngine

VARIABLE = "MIZUOTO_BROKEN_IMPORTED"
os.environ[VARIABLE] = "1"  # the breakage: at import, the same every time


class Engine(BaseEngine):
    pass


def restore() -> None:
    """Remove the variable (the module stays imported, so it is not set again)."""
    os.environ.pop(VARIABLE, None)
