"""Module paths of the previous release import the moved modules for one more release, warning."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from mizuoto_runtime import _moved

# In a fresh interpreter, so that no old name already sits in sys.modules.
_CHECK = """
import importlib, json, sys, warnings
problems = []
for old, new in json.loads(sys.argv[1]).items():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    if module is not importlib.import_module(new):
        problems.append(f"{old} is not {new}")
    if not any(w.category is DeprecationWarning and new in str(w.message) for w in seen):
        problems.append(f"{old} imported without a DeprecationWarning naming {new}")
print(json.dumps(problems))
"""


def test_every_old_path_is_the_moved_module_and_warns():
    assert "mizuoto_runtime.loading" in _moved.MOVED  # the table is the one being checked
    done = subprocess.run(
        [sys.executable, "-c", _CHECK, json.dumps(_moved.MOVED)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_an_unknown_module_is_still_missing():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("mizuoto_runtime.no_such_module")
