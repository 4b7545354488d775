"""Module paths that moved into folders, importable under their old names for one release.

Only the names ``mizuoto_runtime`` exports are promised, but engines written against the previous
release import some modules by path (``from mizuoto_runtime.loading import load_into``). Those
paths keep working, with a DeprecationWarning naming the new one, through a finder that sits
last on ``sys.meta_path``: it answers only for the names below, after every other finder failed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

MOVED = {
    **{
        f"mizuoto_runtime.{name}": f"mizuoto_runtime.memory.{name}"
        for name in ("handle", "units", "policy", "placement", "stream", "manager", "occupancy")
    },
    **{
        f"mizuoto_runtime.{name}": f"mizuoto_runtime.devices.{name}"
        for name in ("device", "dtypes", "probe")
    },
    **{
        f"mizuoto_runtime.{name}": f"mizuoto_runtime.weights.{name}"
        for name in ("checkpoint", "loading", "paths")
    },
    **{
        f"mizuoto_runtime.{name}": f"mizuoto_runtime.accel.{name}" for name in ("graphs", "compile")
    },
    "mizuoto_runtime.audio": "mizuoto_runtime.dsp.resample",
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        message = f"{spec.name} moved to {new}; the old path goes in the next release"
        # The import system's own frames are skipped: the warning points at the importing line.
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        # The module under its new name; the import system files it under the old one too.
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: ``create_module`` returned the module already executed."""


def install() -> None:
    """Put the finder last on ``sys.meta_path``, once per process."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
