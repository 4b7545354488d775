"""``mizuoto models``: listing, pull and rm through main(argv), and one pull in a real process."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mizuoto_sdk.cli import main
from mizuoto_sdk.host import Discovery, RuntimeService

SITE = Path(__file__).parent / "models_site"


@pytest.fixture
def served(monkeypatch):
    monkeypatch.syspath_prepend(str(SITE))
    server_module = importlib.import_module("mizuoto_fixture_models.server")
    with server_module.FileServer() as server:
        monkeypatch.setenv("MIZUOTO_FIXTURE_MODELS_URL", server.url)
        yield server


def _service(cache: Path) -> RuntimeService:
    return RuntimeService({"models.cache": str(cache)}, Discovery(path=[str(SITE)], selection=None))


def test_list_pull_and_rm(served, tmp_path, capsys):
    service = _service(tmp_path)
    assert main(["models", "fetched", "--json"], service) == 0
    states = {row["model"]: row["state"] for row in json.loads(capsys.readouterr().out)}
    assert states == {"url": "missing", "hub": "missing", "bundled": "installed"}

    assert main(["models", "pull", "fetched:url"], service) == 0
    out = capsys.readouterr().out
    assert "installed fetched:url" in out and str(tmp_path / "fetched" / "url") in out
    assert main(["models", "fetched"], service) == 0
    assert "fetched:url  installed  url" in capsys.readouterr().out

    assert main(["models", "rm", "fetched:url"], service) == 0
    assert "removed fetched:url" in capsys.readouterr().out
    assert main(["models", "fetched"], service) == 0
    assert "install: mizuoto models pull fetched:url" in capsys.readouterr().out


def test_a_failed_pull_exits_1_with_the_code(served, tmp_path, capsys):
    served.wrong.add("weights.bin")
    assert main(["models", "pull", "fetched:url"], _service(tmp_path)) == 1
    assert "[model_not_installed]" in capsys.readouterr().err
    assert not (tmp_path / "fetched" / "url").exists()


@pytest.mark.parametrize(
    "argv", [["models", "pull"], ["models", "a", "b"], ["models", "pull", "nope:x"]]
)
def test_usage_mistakes_exit_2(served, tmp_path, capsys, argv):
    assert main(argv, _service(tmp_path)) == 2
    assert "error" in capsys.readouterr().err


def test_pull_in_a_real_process(served, tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SITE), os.environ.get("PYTHONPATH", "")]),
        "MIZUOTO_PLUGINS": "mizuoto-fixture-models",
        "MIZUOTO_HOME": str(tmp_path),
        "MIZUOTO_FIXTURE_MODELS_URL": served.url,
    }
    served.cut.add("weights.bin")
    command = [sys.executable, "-m", "mizuoto_sdk.cli", "models", "pull", "fetched:url"]
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 1 and "pull again to resume" in first.stderr
    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "installed fetched:url" in second.stdout
    assert (tmp_path / "models" / "fetched" / "url" / "weights.bin").is_file()
