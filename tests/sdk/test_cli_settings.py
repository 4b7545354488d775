"""Settings from files and --set, `mizuoto settings`, and the command's basics."""

from __future__ import annotations

from pathlib import Path

import pytest

from mizuoto_sdk import EngineError
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
