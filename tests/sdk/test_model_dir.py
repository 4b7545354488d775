"""``engines.<id>.model_dir``: the engine's current model read from a folder of the user's,
checked for the manifest's ``required_files``, shown as ``local`` by ``mizuoto models``."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mizuoto_sdk import InvalidRequest, ModelEntry, ModelNotInstalled
from mizuoto_sdk.cli import main
from mizuoto_sdk.host import Discovery, RuntimeService

SITE = Path(__file__).parent / "models_site"


@pytest.fixture
def discovery(monkeypatch):
    monkeypatch.syspath_prepend(str(SITE))
    importlib.import_module("mizuoto_fixture_models")
    return Discovery(path=[str(SITE)], selection=None)


def _folder(root: Path, *names: str) -> Path:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x" * 3)
    return root


def _service(tmp_path: Path, discovery: Discovery, **settings: object) -> RuntimeService:
    values = {"models.cache": str(tmp_path / "cache"), "engines.fetched.model": "hub", **settings}
    return RuntimeService(values, discovery)


def test_the_current_model_loads_from_the_folder_instead_of_its_source(tmp_path, discovery):
    folder = _folder(tmp_path / "mine", "config/model.json", "weights.bin", "extra.txt")
    service = _service(tmp_path, discovery, **{"engines.fetched.model_dir": str(folder)})
    # the Hub copy was never pulled: the folder stands in for it, sha256s unchecked
    names = ["config/model.json", "extra.txt", "weights.bin"]
    assert service.load("fetched").call("files") == names
    assert service.load("fetched", "hub").call("files") == names
    # another model of the engine keeps its own source
    assert service.load("fetched", "bundled").call("files") == ["config/model.json"]
    with pytest.raises(ModelNotInstalled, match="mizuoto models pull fetched:url"):
        service.load("fetched", "url")


def test_a_folder_without_the_required_files_is_refused_naming_them(tmp_path, discovery):
    folder = _folder(tmp_path / "mine", "config/model.json")
    service = _service(tmp_path, discovery, **{"engines.fetched.model_dir": str(folder)})
    with pytest.raises(ModelNotInstalled, match=r"weights\.bin") as failed:
        service.load("fetched")
    assert "engines.fetched.model_dir" in str(failed.value)
    assert failed.value.detail["folder"] == str(folder)
    gone = _service(tmp_path, discovery, **{"engines.fetched.model_dir": str(tmp_path / "no")})
    with pytest.raises(ModelNotInstalled, match="is not a folder"):
        gone.load("fetched")


def test_changing_the_setting_loads_the_new_folder(tmp_path, discovery):
    first = _folder(tmp_path / "a", "config/model.json", "weights.bin")
    second = _folder(tmp_path / "b", "config/model.json", "weights.bin", "b-only.txt")
    service = _service(tmp_path, discovery, **{"engines.fetched.model_dir": str(first)})
    held = service.load("fetched")
    assert "b-only.txt" not in held.call("files")
    service.settings.set("engines.fetched.model_dir", str(second))
    assert "b-only.txt" in service.load("fetched").call("files")


def test_the_setting_is_a_folder_path_stored_absolute(tmp_path, discovery, monkeypatch):
    monkeypatch.chdir(tmp_path)
    service = _service(tmp_path, discovery, **{"engines.fetched.model_dir": "relative"})
    assert service.settings.engine("fetched", "model_dir") == str(tmp_path / "relative")
    with pytest.raises(InvalidRequest, match=r"engines\.fetched\.model_dir"):
        service.settings.set("engines.fetched.model_dir", 3)


def test_models_lists_the_current_model_as_local_with_its_folder(tmp_path, discovery, capsys):
    folder = _folder(tmp_path / "mine", "config/model.json", "weights.bin")
    service = _service(tmp_path, discovery, **{"engines.fetched.model_dir": str(folder)})
    assert main(["models", "fetched", "--json"], service) == 0
    rows = {row["model"]: row for row in json.loads(capsys.readouterr().out)}
    assert (rows["hub"]["source"], rows["hub"]["state"]) == ("local", "installed")
    assert rows["hub"]["folder"] == str(folder)
    assert rows["url"]["source"] == "url"
    (folder / "weights.bin").unlink()
    assert main(["models", "fetched"], service) == 0
    out = capsys.readouterr().out
    assert f"fetched:hub  missing  local  0.0 MiB  {folder}" in out
    assert "lacks weights.bin" in out


def test_required_files_must_be_relative_paths():
    assert ModelEntry("m", required_files="config.json").required_files == ("config.json",)
    for bad in (["../config.json"], ["a//b"], [3]):
        with pytest.raises(ValueError, match="required_files"):
            ModelEntry("m", required_files=bad)


def test_the_set_flag_reaches_a_real_process(tmp_path):
    folder = _folder(tmp_path / "mine", "config/model.json", "weights.bin")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SITE), os.environ.get("PYTHONPATH", "")]),
        "MIZUOTO_PLUGINS": "mizuoto-fixture-models",
        "MIZUOTO_HOME": str(tmp_path / "home"),
    }
    command = [
        sys.executable,
        "-m",
        "mizuoto_sdk.cli",
        "models",
        "fetched",
        "--set",
        "engines.fetched.model=hub",
        "--set",
        f"engines.fetched.model_dir={folder}",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "fetched:hub  installed  local" in done.stdout and str(folder) in done.stdout
