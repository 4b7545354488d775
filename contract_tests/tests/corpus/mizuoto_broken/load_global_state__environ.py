"""load.global_state, disguised: importing the engine exports a setting into the environment
through a helper that is handed ``os.environ`` as the mapping to fill (which mapping it fills is
only known at run time, so the static scan does not see it), the same way every time (the module
is imported once per process, before any check's own snapshot)."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from mizuoto_broken.base import BaseEngine

VARIABLE = "MIZUOTO_BROKEN_IMPORTED"


def _export(settings: dict[str, str], into: MutableMapping[str, str]) -> None:
    into.update(settings)


_export({VARIABLE: "1"}, os.environ)  # the breakage, at import


class Engine(BaseEngine):
    pass


def restore() -> None:
    """Remove the variable (the module stays imported, so it is not set again)."""
    _forget(VARIABLE, os.environ)


def _forget(variable: str, mapping: MutableMapping[str, str]) -> None:
    mapping.pop(variable, None)
