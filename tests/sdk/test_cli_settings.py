"""Settings from files and --set, `mizuoto settings`, and the command's basics."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mizuoto_sdk import EngineError
from mizuoto_sdk.cli import main
from mizuoto_sdk.host.sources import effective_settings, parse_override

NO_FILE = Path("/nonexistent/mizuoto/settings.toml")


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_when_no_file_and_no_override():
    settings, origin = effective_settings(user_file=NO_FILE, environ={})
    assert settings.get("compute.attention") == "auto"
    assert set(origin.values()) == {"default"}
    assert set(origin) == set(settings.as_dict())


def test_user_file_then_named_file_then_set(tmp_path):
    user = write(
        tmp_path / "user.toml",
        "[compute]\nattention = 'sdpa'\nmax_resident_models = 3\n\n"
        "[engines.sine]\ndevice = 'cpu'\noptions = { speed = 2 }\n",
    )
    named = write(tmp_path / "named.toml", "compute.max_resident_models = 4\n")
    settings, origin = effective_settings(
        ["compute.max_resident_models=5", "voices.roots=" + str(tmp_path)],
        user_file=user,
        environ={"MIZUOTO_SETTINGS": str(named)},
    )
    assert settings.get("compute.attention") == "sdpa"
    assert origin["compute.attention"] == str(user)
    assert settings.engine("sine", "options") == {"speed": 2}
    assert origin["engines.sine.options"] == str(user)
    assert settings.get("compute.max_resident_models") == 5
    assert origin["compute.max_resident_models"] == "--set"
    assert settings.get("voices.roots") == (str(tmp_path),)
    assert origin["compute.kv_cache"] == "default"
    without_set, origin = effective_settings(
        user_file=user, environ={"MIZUOTO_SETTINGS": str(named)}
    )
    assert without_set.get("compute.max_resident_models") == 4
    assert origin["compute.max_resident_models"] == str(named)


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("# settings\n[compute]\nattention = 'sdpa'\nkv_cahce = 'static'\n", 4, "compute.kv_cahce"),
        ("[engines.sine]\ndevice = 'cpu'\n\ndtype = 'fp77'\n", 4, "engines.sine.dtype"),
        ("engines = { sine = { pinned = 'yes' } }\n", 1, "engines.sine.pinned"),
        ('"compute".compile = 1\n', 1, "compute.compile"),
    ],
)
def test_a_bad_key_or_value_names_the_file_and_line(tmp_path, text, line, field):
    path = write(tmp_path / "settings.toml", text)
    with pytest.raises(EngineError) as caught:
        effective_settings(user_file=path, environ={})
    assert caught.value.code == "invalid_request"
    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert caught.value.detail == {**caught.value.detail, "field": field, "line": line}


def test_a_file_that_is_not_toml_names_its_line(tmp_path):
    path = write(tmp_path / "settings.toml", "[compute]\nattention = sdpa\n")
    with pytest.raises(EngineError, match=rf"^{path}:2: not valid TOML"):
        effective_settings(user_file=path, environ={})


def test_a_named_file_that_is_missing_is_an_error(tmp_path):
    with pytest.raises(EngineError, match=r"MIZUOTO_SETTINGS names .* not a file"):
        effective_settings(user_file=NO_FILE, environ={"MIZUOTO_SETTINGS": str(tmp_path / "x")})


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("compute.compile=true", True),
        ("compute.max_resident_models=2", 2),
        ("engines.sine.device=cuda:0", "cuda:0"),
        ("engines.sine.model='2024'", "2024"),
        ('voices.roots=["a", "b"]', ["a", "b"]),
        ("engines.sine.variant=a b", "a b"),
    ],
)
def test_set_values_are_toml_when_they_parse_else_strings(text, value):
    assert parse_override(text)[1] == value


@pytest.mark.parametrize("text", ["compute.compile", "=1"])
def test_set_without_a_key_and_value_is_refused(text):
    with pytest.raises(EngineError, match="expected KEY=VALUE"):
        parse_override(text)


def test_a_bad_set_names_the_option():
    with pytest.raises(EngineError, match=r"^--set compute.compile=maybe: compute.compile"):
        effective_settings(["compute.compile=maybe"], user_file=NO_FILE, environ={})


@pytest.fixture
def config_home(tmp_path, monkeypatch):
    """A user config folder of the test's own (platformdirs reads XDG_CONFIG_HOME on Linux)."""
    home = tmp_path / "config"
    (home / "mizuoto").mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.delenv("MIZUOTO_SETTINGS", raising=False)
    return home / "mizuoto"


def test_settings_command_shows_values_and_sources(config_home, capsys):
    user = write(config_home / "settings.toml", "[compute]\nkv_cache = 'static'\n")
    argv = ["settings", "--json", "--set", "compute.compile=true"]
    assert main(argv) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["user_file"] == str(user)
    assert shown["settings"]["compute.kv_cache"] == {"value": "static", "source": str(user)}
    assert shown["settings"]["compute.compile"] == {"value": True, "source": "--set"}
    assert shown["settings"]["compute.attention"] == {"value": "auto", "source": "default"}
    assert main(["settings"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == f"user settings file: {user}"
    assert ["compute.kv_cache", '"static"', str(user)] in [line.split() for line in table]


def test_a_bad_settings_file_exits_2_naming_file_and_line(config_home, capsys):
    user = write(config_home / "settings.toml", "[compute]\n\nattention = 'fast'\n")
    assert main(["settings"]) == 2
    assert f"{user}:3: compute.attention" in capsys.readouterr().err
    assert main(["settings", "--set", "nonsense"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_synth_and_runtime_run_with_the_effective_settings(config_home, tmp_path, capsys):
    write(config_home / "settings.toml", "[compute]\nattention = 'nonsense'\n")
    out = tmp_path / "x.wav"
    assert main(["synth", "sine", "hi", "-o", str(out)]) == 2
    assert "settings.toml:2: compute.attention" in capsys.readouterr().err
    assert not out.exists()
    assert main(["runtime", "--set", "compute.attention=nonsense"]) == 2
    write(config_home / "settings.toml", "")
    assert main(["synth", "sine", "hi", "-o", str(out), "--set", "compute.kv_cache=static"]) == 0
    assert out.exists()


def test_the_settings_file_and_settings_variable_in_a_real_process(tmp_path):
    (tmp_path / "mizuoto").mkdir()
    user = write(tmp_path / "mizuoto" / "settings.toml", "[compute]\nkv_cache = 'static'\n")
    named = write(tmp_path / "named.toml", "[engines.sine]\ndtype = 'fp32'\n")
    environ = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "MIZUOTO_SETTINGS": str(named)}
    done = subprocess.run(
        [sys.executable, "-m", "mizuoto_sdk.cli", "settings", "--json"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)["settings"]
    assert shown["compute.kv_cache"] == {"value": "static", "source": str(user)}
    assert shown["engines.sine.dtype"] == {"value": "float32", "source": str(named)}


def test_version_and_bare_help(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"mizuoto {importlib.metadata.version('mizuoto-sdk')}\n"
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: mizuoto")
    assert "settings" in out


@pytest.fixture
def classes(monkeypatch):
    """Plugins whose engine classes fail in their own ways (tests/sdk/plugin_sites/classes)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "plugin_sites" / "classes"))
    monkeypatch.setenv("MIZUOTO_PLUGINS", "mizuoto-fixture-classes")


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_prints_the_engine_traceback(classes, tmp_path, capsys, where):
    argv = ["synth", "raises-on-import", "hi", "-o", str(tmp_path / "x.wav")]
    assert main(argv) == 1
    assert "Traceback" not in capsys.readouterr().err
    assert main(["--debug", *argv] if where == "before" else [*argv, "--debug"]) == 1
    err = capsys.readouterr().err
    assert 'raises_on_import.py", line 3, in <module>' in err  # the engine's own frame
    assert "OSError: missing weights" in err
    assert err.splitlines()[-1].startswith("mizuoto: error [engine_unavailable]")


def test_engines_and_doctor_quote_the_fix_for_a_missing_extra(classes, capsys):
    assert main(["engines"]) == 0
    assert "pip install 'mizuoto-absent-extra>=1.0'" in capsys.readouterr().out
    main(["doctor"])
    assert "lacks extras: pip install 'mizuoto-absent-extra>=1.0'" in capsys.readouterr().out


def test_engines_says_when_the_plugin_selection_left_nothing(monkeypatch, capsys):
    monkeypatch.setenv("MIZUOTO_PLUGINS", "no-such-distribution")
    assert main(["engines"]) == 0
    out = capsys.readouterr().out
    assert "MIZUOTO_PLUGINS='no-such-distribution' selects none" in out
    assert "mizuoto-engine-sine" in out


def test_engines_shows_a_plugin_failure_once():
    site = Path(__file__).parent / "plugin_sites" / "import_fails"
    done = subprocess.run(
        [sys.executable, "-m", "mizuoto_sdk.cli", "engines"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.count("RuntimeError: no such backend") == 1
