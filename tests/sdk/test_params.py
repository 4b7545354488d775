"""Request params as a declared schema: the declaration, each type's check and parse, and the host
checking a request against the manifest before the engine runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mizuoto_sdk import EngineManifest, InvalidRequest, ModelEntry, Param
from mizuoto_sdk.cli import main
from mizuoto_sdk.host import EngineRequest, RuntimeService


def manifest(*params: Param) -> EngineManifest:
    return EngineManifest(
        id="x",
        implementation="pkg.engine:X",
        models=[ModelEntry("m")],
        capabilities=["synthesize"],
        params=params,
    )


# The declaration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: Param("Top-K", "int", 1), "lowercase identifier"),
        (lambda: Param("k", "complex", 1), "expected one of int, float, bool, str, path"),
        (lambda: Param("k", "int", 0, minimum=1), "default"),
        (lambda: Param("k", "int", 1.5), "default"),
        (lambda: Param("k", "float", 0.0, minimum=0, exclusive_minimum=True), "default"),
        (lambda: Param("k", "int", 1, minimum=5, maximum=2), "holds no value"),
        (lambda: Param("k", "str", "a", minimum=1), "bound an int or float"),
        (lambda: Param("k", "int", 1, exclusive_maximum=True), "needs the bound"),
        (lambda: Param("k", "str", "c", choices=["a", "b"]), "default"),
        (lambda: Param("k", "str", "a", choices=["a", "a"]), "twice"),
        (lambda: Param("k", "int", 1, choices=[1, 2], minimum=0), "not both"),
        (lambda: Param("k", "bool", True, choices=[True]), "choices"),
        (lambda: Param("k", "int", 1, help="two\nlines"), "one line"),
    ],
)
def test_a_bad_declaration_is_refused_naming_what_is_wrong(make, words):
    with pytest.raises((ValueError, TypeError), match=words):
        make()


def test_a_manifest_refuses_repeated_names_and_the_hosts_own_params():
    with pytest.raises(ValueError, match="repeat"):
        manifest(Param("k", "int", 1), Param("k", "float", 1.0))
    with pytest.raises(ValueError, match="belong to the host"):
        manifest(Param("seed", "int", 1))
    with pytest.raises(ValueError, match="expected Param"):
        manifest({"name": "k"})  # type: ignore[arg-type]


def test_a_default_is_held_as_its_type():
    assert Param("rate", "float", 1).default == 1.0
    assert isinstance(Param("rate", "float", 1).default, float)


# check and parse, type by type -----------------------------------------------------------------

CASES = [
    # param, accepted (given -> value), refused
    (Param("n", "int", 2, minimum=1, maximum=8), [(1, 1), (8, 8)], [0, 9, 2.0, True, "3"]),
    (
        Param("p", "float", 0.5, minimum=0, maximum=1, exclusive_minimum=True),
        [(1, 1.0), (0.25, 0.25)],
        [0, 1.5, math.nan, math.inf, False, "0.5"],
    ),
    (Param("t", "float", 1.0), [(-3, -3.0), (2.5, 2.5)], [math.inf, math.nan, "x"]),
    (Param("b", "bool", False), [(True, True), (False, False)], [0, 1, "yes"]),
    (Param("s", "str", "a", choices=["a", "b"]), [("b", "b")], ["c", 1]),
    (Param("v", "path", None), [(Path("/v/anna"), "/v/anna"), ("anna", "anna")], ["", 7]),
]


@pytest.mark.parametrize(
    ("param", "accepted", "refused"), CASES, ids=lambda c: getattr(c, "name", "")
)
def test_check_types_the_value_and_refuses_the_rest_naming_the_field(param, accepted, refused):
    assert param.check(None) == param.default
    for given, value in accepted:
        assert param.check(given) == value and type(param.check(given)) is type(value)
    for given in refused:
        with pytest.raises(InvalidRequest) as caught:
            param.check(given)
        assert caught.value.detail["field"] == f"params.{param.name}"
        assert param.expected() in str(caught.value)


@pytest.mark.parametrize(
    ("param", "text", "value"),
    [
        (Param("n", "int", 2, minimum=1), " 12 ", 12),
        (Param("p", "float", 0.5), "1e-3", 0.001),
        (Param("b", "bool", False), "yes", True),
        (Param("b", "bool", False), "Off", False),
        (Param("s", "str", "a", choices=["a", "b"]), "b", "b"),
        (Param("v", "path", None), "voices/anna", "voices/anna"),
    ],
)
def test_parse_turns_command_line_text_into_the_typed_value(param, text, value):
    assert param.parse(text) == value and type(param.parse(text)) is type(value)


@pytest.mark.parametrize(
    ("param", "text"),
    [
        (Param("n", "int", 2, minimum=1), "1.5"),
        (Param("n", "int", 2, minimum=1), "0"),
        (Param("p", "float", 0.5), "fast"),
        (Param("p", "float", 0.5), "nan"),
        (Param("b", "bool", False), "maybe"),
        (Param("s", "str", "a", choices=["a", "b"]), "c"),
        (Param("v", "path", None), ""),
    ],
)
def test_parse_refuses_with_the_same_error_as_check(param, text):
    with pytest.raises(InvalidRequest) as caught:
        param.parse(text)
    assert caught.value.detail == {"field": f"params.{param.name}", "expected": param.expected()}


def test_expected_reads_as_a_range():
    assert Param("k", "int", 1, minimum=1).expected() == "an integer >= 1"
    assert Param("t", "float", 1.0, minimum=0, exclusive_minimum=True).expected() == "a number > 0"
    assert Param("p", "float", 1.0, minimum=0, maximum=1).expected() == "a number in [0, 1]"


# A manifest's check ---------------------------------------------------------------------------


def test_defaults_are_filled_and_the_seed_is_kept_when_given():
    declared = manifest(Param("speed", "float", 1.0, minimum=0.25, maximum=4), Param("v", "path"))
    assert declared.check_params({}) == {"speed": 1.0, "v": None}
    assert declared.check_params({"speed": 2, "seed": 7}) == {"speed": 2.0, "v": None, "seed": 7}
    assert declared.check_params({"speed": None})["speed"] == 1.0  # None: not given


def test_an_unknown_param_is_refused_listing_the_known_ones():
    declared = manifest(Param("speed", "float", 1.0), Param("pitch", "float", 0.0))
    with pytest.raises(InvalidRequest) as caught:
        declared.check_params({"sped": 2})
    assert caught.value.detail == {"field": "params.sped", "known": ["pitch", "seed", "speed"]}
    assert "did you mean 'speed'?" in str(caught.value)


def test_the_seed_is_checked_as_the_hosts_param():
    with pytest.raises(InvalidRequest) as caught:
        manifest(Param("speed", "float", 1.0)).check_params({"seed": -1})
    assert caught.value.detail["field"] == "params.seed"


def test_a_manifest_without_params_passes_them_through_unchecked():
    params = {"anything": object(), "seed": 3}
    assert manifest().check_params(params) is params


# Through the host ------------------------------------------------------------------------------


@pytest.fixture
def service(host_engine):
    return RuntimeService(discovery=host_engine.discovery)


def test_the_engine_gets_checked_values_with_defaults_filled(service):
    request = EngineRequest(params={"mode": "echo_params", "chunks": 1, "seed": 5})
    (chunk,) = service.load("declared").synthesize("hi", request)
    assert chunk.metadata["params"] == {
        "mode": "echo_params",
        "chunks": 1,
        "level": 0.5,
        "loud": False,
        "style": "plain",
        "voice": None,
        "seed": 5,
    }
    assert request.params == {"mode": "echo_params", "chunks": 1, "seed": 5}  # as the caller gave
    assert request.applied["seed"] == 5


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"chunks": 0}, "params.chunks"),
        ({"level": 0}, "params.level"),
        ({"loud": "yes"}, "params.loud"),
        ({"style": "dark"}, "params.style"),
        ({"voice": ""}, "params.voice"),
        ({"chunk": 2}, "params.chunk"),
    ],
)
def test_the_host_refuses_a_bad_param_before_the_engine_runs(service, host_engine, params, field):
    with pytest.raises(InvalidRequest) as caught:
        service.load("declared").synthesize("hi", EngineRequest(params=params))
    assert caught.value.detail["field"] == field
    assert caught.value.detail["engine"] == "declared"
    assert not [event for event in host_engine.events if event[0] != "load"]


def test_the_host_refuses_a_bad_param_without_loading_an_unloaded_model(service, host_engine):
    handle = service.load("declared")
    handle.engine.unload()
    host_engine.events.clear()
    with pytest.raises(InvalidRequest):
        handle.synthesize("hi", EngineRequest(params={"nope": 1}))
    assert host_engine.events == []


def test_an_engine_without_declared_params_gets_them_as_given(service):
    request = EngineRequest(params={"mode": "echo_params", "chunks": 1, "made_up": [1, 2]})
    (chunk,) = service.load("hosted", "a").synthesize("hi", request)
    assert chunk.metadata["params"] == {"mode": "echo_params", "chunks": 1, "made_up": [1, 2]}


def test_engines_json_lists_each_engines_params(host_engine, monkeypatch, capsys):
    monkeypatch.setenv("MIZUOTO_PLUGINS", "mizuoto-fixture-host")
    monkeypatch.syspath_prepend(str(Path(host_engine.module.__file__).parents[1]))
    assert main(["engines", "--json"]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    params = {param["name"]: param for param in rows["declared"]["params"]}
    assert params["chunks"] == {
        "name": "chunks",
        "type": "int",
        "default": 3,
        "help": "how many chunks",
        "minimum": 1,
        "exclusive_minimum": False,
        "maximum": 1000,
        "exclusive_maximum": False,
    }
    assert params["style"]["choices"] == ["plain", "bright"]
    assert rows["hosted"]["params"] == []
