"""load.global_state, disguised: importing the engine sets an environment variable through
``getattr(os, "environ")``, a spelling the static scan does not resolve, the same way every time
(the module is imported once per process, before any check's own snapshot)."""

from __future__ import annotations

import os

from mizuoto_broken.base import BaseEngine

VARIABLE = "MIZUOTO_BROKEN_IMPORTED"
getattr(os, "environ")[VARIABLE] = "1"  # noqa: B009 - the breakage, at import


class Engine(BaseEngine):
    pass


def restore() -> None:
    """Remove the variable (the module stays imported, so it is not set again)."""
    getattr(os, "environ").pop(VARIABLE, None)  # noqa: B009 - past the scan, as above
