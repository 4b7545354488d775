"""Listing, doctor and plugin modules never import torch (checked in fresh interpreters)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PATHS = {
    "import mizuoto_sdk": "import mizuoto_sdk, mizuoto_sdk.host, mizuoto_runtime.context",
    "mizuoto_sdk's names": "import mizuoto_sdk; mizuoto_sdk.__all__; dir(mizuoto_sdk); "
    "from mizuoto_sdk import RequestContext, Runtime, ModelHandle",
    "import mizuoto_runtime": "import mizuoto_runtime; mizuoto_runtime.__all__; "
    "dir(mizuoto_runtime)",
    "mizuoto engines --json": "from mizuoto_sdk.cli import main; main(['engines', '--json'])",
    "mizuoto doctor": "from mizuoto_sdk.cli import main; main(['doctor', '--json'])",
    "mizuoto runtime": "from mizuoto_sdk.cli import main; main(['runtime'])",
    "the sine plugin module": "import mizuoto_engine_sine.plugin",
    "get_engine('sine')": "import mizuoto_sdk.host; mizuoto_sdk.host.get_engine('sine')",
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
    if path in ("import mizuoto_sdk", "mizuoto_sdk's names", "import mizuoto_runtime"):
        assert imported == "[]", f"{path} imported {imported}"


def test_the_first_load_imports_torch():
    script = (
        "import sys; from mizuoto_sdk.host import RuntimeService; "
        "RuntimeService().load('sine'); print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "True", done.stderr


def test_every_exported_name_resolves_and_is_listed():
    import mizuoto_runtime
    import mizuoto_sdk
    from mizuoto_runtime.context import RequestContext
    from mizuoto_runtime.lm.decoder import QwenDecoder
    from mizuoto_runtime.memory.handle import ModelHandle
    from mizuoto_runtime.runtime import Runtime

    for module in (mizuoto_sdk, mizuoto_runtime):
        assert set(module.__all__) <= set(dir(module))
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"
    assert (mizuoto_sdk.RequestContext, mizuoto_sdk.Runtime, mizuoto_sdk.ModelHandle) == (
        RequestContext,
        Runtime,
        ModelHandle,
    )
    assert mizuoto_runtime.QwenDecoder is QwenDecoder
    assert mizuoto_runtime.ops is sys.modules["mizuoto_runtime.ops"]
    with pytest.raises(AttributeError, match="no attribute 'QwenDecodr'"):
        mizuoto_runtime.QwenDecodr  # noqa: B018


@pytest.mark.parametrize(
    "name", ["Discovery", "EngineRecord", "discover", "get_engine", "error_from_code"]
)
def test_a_moved_host_name_still_works_from_mizuoto_sdk_and_warns(name):
    import mizuoto_sdk
    import mizuoto_sdk.host

    with pytest.warns(DeprecationWarning, match=rf"use mizuoto_sdk\.host\.{name}\b") as caught:
        old = getattr(mizuoto_sdk, name)
    assert old is getattr(mizuoto_sdk.host, name)
    assert len(caught) == 1 and caught[0].filename == __file__
    assert name not in mizuoto_sdk.__all__


def test_from_import_of_a_moved_name_warns_once_at_the_importing_line():
    with pytest.warns(DeprecationWarning) as caught:
        from mizuoto_sdk import discover  # noqa: F401
    assert [w.filename for w in caught] == [__file__]
