"""ComputeSettings: the compute.* settings as one typed value, its defaults, checks and names,
and the call's ``ctx.compute`` as the host builds it."""

from __future__ import annotations

import attrs
import pytest

from mizuoto_runtime.context import RequestContext
from mizuoto_sdk import ComputeSettings, InvalidRequest
from mizuoto_sdk.host import RuntimeService, Settings

BAD_VALUES = [
    ("max_resident_models", 0, "an integer >= 1 or None"),
    ("max_resident_models", True, "an integer >= 1 or None"),
    ("attention", "fastest", "one of auto, sdpa, math, flash, xformers, sage"),
    ("kv_cache", "paged", "one of dynamic, static"),
    ("compile", 1, "true or false"),
    ("cuda_graphs", "yes", "true or false"),
    ("simulate_vram_mb", 0, "a number of MiB > 0"),
    ("simulate_vram_mb", 1e-9, "at least one byte"),
    ("simulate_vram_mb", float("inf"), "finite"),
    ("vram_headroom_mb", -1, "a number of MiB >= 0"),
    ("vram_headroom_mb", float("nan"), "finite"),
    ("stream_in_flight", 1.5, "an integer >= 1 or None"),
    ("working_margin", 0.5, "a factor >= 1"),
    ("working_margin", "2", "a factor >= 1"),
]


def test_the_defaults_are_declared_once_and_every_reader_sees_them():
    defaults = ComputeSettings()
    assert defaults.attention == "auto" and defaults.kv_cache == "dynamic"
    assert defaults.compile is False and defaults.cuda_graphs is False
    assert defaults.max_resident_models is None and defaults.simulate_vram_mb is None
    assert ComputeSettings.from_settings({}) == defaults
    assert Settings().compute == defaults
    assert RequestContext().compute == defaults
    assert set(Settings().as_dict()) >= {f"compute.{name}" for name in ComputeSettings.names()}


def test_the_value_is_frozen_and_replace_checks_the_change():
    compute = ComputeSettings(kv_cache="static")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        compute.kv_cache = "dynamic"  # type: ignore[misc]
    assert compute.replace(cuda_graphs=True) == ComputeSettings(kv_cache="static", cuda_graphs=True)
    with pytest.raises(InvalidRequest, match=r"compute\.kv_cache"):
        compute.replace(kv_cache="paged")


@pytest.mark.parametrize(("name", "value", "expected"), BAD_VALUES)
def test_each_field_refuses_a_bad_value_naming_the_setting(name: str, value: object, expected):
    key = f"compute.{name}"
    for build in (
        lambda: ComputeSettings(**{name: value}),
        lambda: ComputeSettings.from_settings({key: value}),
        lambda: Settings({key: value}),
        lambda: Settings().set(key, value),
        lambda: RequestContext(settings={key: value}),
    ):
        with pytest.raises(InvalidRequest) as failure:
            build()
        assert failure.value.detail["field"] == key
        assert str(failure.value).startswith(f"{key}: expected") and expected in str(failure.value)


def test_good_values_round_trip_through_the_dotted_settings():
    compute = ComputeSettings(
        max_resident_models=2,
        attention="sdpa",
        kv_cache="static",
        compile=True,
        cuda_graphs=True,
        simulate_vram_mb=64,
        vram_headroom_mb=0,
        stream_in_flight=1,
        working_margin=1.5,
    )
    dotted = compute.as_settings()
    assert dotted["compute.kv_cache"] == "static" and len(dotted) == len(ComputeSettings.names())
    assert ComputeSettings.from_settings(dotted) == compute
    assert Settings(dotted).compute == compute


def test_a_misspelt_compute_key_names_the_known_ones_and_the_closest():
    for build in (
        lambda: ComputeSettings.from_settings({"compute.kv_cahce": "static"}),
        lambda: Settings({"compute.kv_cahce": "static"}),
        lambda: RequestContext(settings={"compute.kv_cahce": "static"}),
    ):
        with pytest.raises(InvalidRequest) as failure:
            build()
        message = str(failure.value)
        assert failure.value.detail["field"] == "compute.kv_cahce"
        assert "did you mean compute.kv_cache?" in message
        assert all(f"compute.{name}" in message for name in ComputeSettings.names())


def test_keys_outside_compute_are_left_to_the_other_settings():
    settings = {"voices.roots": ["/voices"], "engines.sine.dtype": "fp32"}
    assert ComputeSettings.from_settings(settings) == ComputeSettings()
    ctx = RequestContext(settings={**settings, "compute.attention": "math"})
    assert ctx.compute.attention == "math" and ctx.settings["voices.roots"] == ["/voices"]


def test_a_context_takes_the_typed_value_over_dotted_keys():
    compute = ComputeSettings(cuda_graphs=True)
    ctx = RequestContext(settings={"compute.cuda_graphs": False}, compute=compute)
    assert ctx.compute is compute
    with pytest.raises(TypeError, match="ComputeSettings"):
        RequestContext(compute={"compute.cuda_graphs": True})  # type: ignore[arg-type]


def test_settings_compute_follows_every_change():
    settings = Settings({"compute.kv_cache": "static"})
    before = settings.compute
    settings.set("compute.cuda_graphs", True)
    assert before.cuda_graphs is False  # a value once read never changes
    assert settings.compute == ComputeSettings(kv_cache="static", cuda_graphs=True)


def test_compute_fast_is_retired_with_a_warning_and_ignored():
    with pytest.warns(DeprecationWarning, match=r"compute\.fast .*never had an effect"):
        settings = Settings({"compute.fast": True, "compute.attention": "sdpa"})
    assert "compute.fast" not in settings.as_dict()
    assert settings.compute == ComputeSettings(attention="sdpa")
    heard: list[str] = []
    settings.subscribe(lambda key, value: heard.append(key))
    with pytest.warns(DeprecationWarning, match=r"compute\.fast"):
        settings.set("compute.fast", True)
    assert heard == [] and "fast" not in ComputeSettings.names()
    with pytest.warns(DeprecationWarning, match=r"compute\.fast"):
        assert ComputeSettings.from_settings({"compute.fast": True}) == ComputeSettings()


def test_the_host_hands_each_call_its_current_compute_settings(host_engine, monkeypatch):
    def call(self, op, payload, ctx):
        return {"compute": ctx.compute}

    monkeypatch.setattr(host_engine.module.Loaded, "call", call)
    service = RuntimeService({"compute.kv_cache": "static"}, host_engine.discovery)
    handle = service.load(host_engine.engine_id, "a")
    assert handle.call("echo", {})["compute"] == ComputeSettings(kv_cache="static")
    service.settings.set("compute.attention", "math")
    assert handle.call("echo", {})["compute"] == ComputeSettings(
        kv_cache="static", attention="math"
    )


def test_the_resident_model_limit_is_read_from_the_typed_settings(host_engine):
    service = RuntimeService({"compute.max_resident_models": 1}, host_engine.discovery)
    assert service.settings.compute.max_resident_models == 1
    service.load(host_engine.engine_id, "a")
    service.load(host_engine.engine_id, "b")
    assert [h.spec.model_id for h in service.models()] == ["b"]
