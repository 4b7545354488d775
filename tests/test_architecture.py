"""Native code (SDK, runtime, bundled plugins) leaves process-global state alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from mizuoto_contract.audit import scan_tree

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("tree", ["mizuoto_sdk", "mizuoto_runtime", "plugins"])
def test_native_code_leaves_global_state_alone(tree):
    violations = scan_tree(ROOT / tree)
    assert violations == [], "\n".join(map(str, violations))
