"""Listing, doctor and plugin modules never import torch (checked in fresh interpreters)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PATHS = {
    "import mizuoto_sdk": "import mizuoto_sdk, mizuoto_sdk.host, mizuoto_runtime.context",
    "mizuoto engines --json": "from mizuoto_sdk.cli import main; main(['engines', '--json'])",
    "mizuoto doctor": "from mizuoto_sdk.cli import main; main(['doctor', '--json'])",
    "mizuoto runtime": "from mizuoto_sdk.cli import main; main(['runtime'])",
    "the sine plugin module": "import mizuoto_engine_sine.plugin",
    "get_engine('sine')": "import mizuoto_sdk; mizuoto_sdk.get_engine('sine')",
    "RuntimeService().engine('sine')": "from mizuoto_sdk.host import RuntimeService; "
    "RuntimeService().engine('sine').start()",
}


@pytest.mark.parametrize("path", PATHS)
def test_path_leaves_torch_unimported(path):
    script = textwrap.dedent(f"""
        import contextlib, io, sys
        with contextlib.redirect_stdout(io.StringIO()):
            {PATHS[path]}
        print(sorted(m for m in ("torch", "numpy") if m in sys.modules))
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    imported = done.stdout.strip().splitlines()[-1]
    assert "torch" not in imported, f"{path} imported torch"
    if path == "import mizuoto_sdk":
        assert imported == "[]", f"{path} imported {imported}"


def test_the_first_load_imports_torch():
    script = (
        "import sys; from mizuoto_sdk.host import RuntimeService; "
        "RuntimeService().loaded('sine'); print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "True", done.stderr
