"""The host and the memory manager: handles registered at load, placed per call, released on OOM.

The CPU plays a GPU of a few hundred KiB (``compute.simulate_vram_mb``), so placement, streaming
and release run for real on models of a few Linear layers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mizuoto_sdk import AudioChunk, EngineError
from mizuoto_sdk.cli import main
from mizuoto_sdk.host import EngineRequest, RuntimeService

LAYER_BYTES = 64 * 64 * 4 + 64 * 4  # engine memo: eight Linear(64, 64) layers in float32
MODEL_BYTES = 8 * LAYER_BYTES


@pytest.fixture
def memo(plugin_site):
    """Engine ``memo`` (tests/sdk/plugin_sites/memo), found through its entry point."""
    plugin_site("memo")


def _service(budget_bytes: int | None) -> RuntimeService:
    settings = {} if budget_bytes is None else {"compute.simulate_vram_mb": budget_bytes / 2**20}
    return RuntimeService(settings)


def _audio(service: RuntimeService, model: str, **params) -> np.ndarray:
    handle = service.load("memo", model)
    chunks = list(handle.synthesize("x", EngineRequest(params=params)))
    return np.concatenate([c.samples for c in chunks])


def _model(service: RuntimeService, model: str) -> dict:
    (row,) = [m for m in service.describe_models() if m["model"] == model]
    return row


def test_loaded_models_show_where_each_component_is(memo):
    service = _service(4 * MODEL_BYTES)
    service.load("memo", "a")
    row = _model(service, "a")
    assert row["name"] == "memo/a@cpu"
    assert row["resident_bytes"] == MODEL_BYTES
    assert row["streamed_bytes"] == row["host_bytes"] == 0
    assert [c["name"] for c in row["components"]] == ["memo/a:stack"]


def test_a_model_that_does_not_fit_streams_and_computes_the_same_bits(memo):
    reference = _audio(_service(None), "a")
    service = _service(MODEL_BYTES // 2)
    streamed = _audio(service, "a")
    assert np.array_equal(streamed, reference)
    row = _model(service, "a")
    assert row["resident_bytes"] <= MODEL_BYTES // 2
    assert row["resident_bytes"] + row["streamed_bytes"] + row["host_bytes"] == MODEL_BYTES
    assert row["streamed_bytes"] > 0


def test_an_idle_model_gives_memory_back_to_the_one_being_called(memo):
    service = _service(MODEL_BYTES + MODEL_BYTES // 2)
    reference_b = _audio(_service(None), "b")
    _audio(service, "a")
    assert np.array_equal(_audio(service, "b"), reference_b)
    a, b = _model(service, "a"), _model(service, "b")
    assert b["resident_bytes"] == MODEL_BYTES  # the called model is whole again
    assert a["resident_bytes"] + b["resident_bytes"] <= MODEL_BYTES + MODEL_BYTES // 2
    assert a["host_bytes"] > 0  # a is still loaded, its units wait in host memory


def test_a_paused_stream_keeps_its_model_in_place(memo):
    service = _service(MODEL_BYTES + MODEL_BYTES // 2)
    reference_b = _audio(_service(None), "b")
    paused = service.load("memo", "a").synthesize("x", EngineRequest(params={"chunks": 2}))
    next(paused)
    assert np.array_equal(_audio(service, "b"), reference_b)
    a, b = _model(service, "a"), _model(service, "b")
    assert a["state"] == "busy" and a["resident_bytes"] == MODEL_BYTES
    assert 0 < b["resident_bytes"] <= MODEL_BYTES // 2 and b["streamed_bytes"] > 0
    paused.close()
    assert np.array_equal(_audio(service, "b"), reference_b)
    assert _model(service, "b")["resident_bytes"] == MODEL_BYTES


def test_out_of_memory_in_a_call_releases_idle_components_but_keeps_them_loaded(memo):
    service = _service(4 * MODEL_BYTES)
    _audio(service, "a")
    with pytest.raises(EngineError) as caught:
        _audio(service, "b", mode="oom")
    assert caught.value.code == "compute_unavailable"
    assert caught.value.detail["reason"] == "out_of_memory"
    assert "memo/a:stack" in caught.value.detail["released"]
    assert "memo/b:stack" not in caught.value.detail["released"]  # the failing model stays
    a = _model(service, "a")
    assert a["resident_bytes"] == 0 and a["host_bytes"] == MODEL_BYTES
    assert np.array_equal(_audio(service, "a"), _audio(_service(None), "a"))


def test_a_plain_module_in_handles_is_managed_as_one(memo):
    service = _service(MODEL_BYTES // 2)
    reference = _audio(_service(None), "a")
    handle = service.load("memo", "a", options={"plain_module": True})
    chunks = list(handle.synthesize("x"))
    assert np.array_equal(np.concatenate([c.samples for c in chunks]), reference)
    (component,) = _model(service, "a")["components"]
    assert component["name"] == "memo/a:Sequential"
    assert component["streamed_bytes"] > 0 and component["resident_bytes"] <= MODEL_BYTES // 2


def test_handles_must_be_model_handles_or_modules(memo):
    service = _service(None)
    with pytest.raises(EngineError, match=r"handles\[0\] is str") as caught:
        service.load("memo", "a", options={"not_a_handle": True})
    assert caught.value.code == "engine_error"
    assert service.describe_models() == []


def test_unloading_forgets_the_components(memo):
    service = _service(4 * MODEL_BYTES)
    service.load("memo", "a")
    service.load("memo", "b")
    assert service.unload("memo/a@cpu") == ["memo/a@cpu"]
    assert [m["model"] for m in service.describe_models()] == ["b"]
    assert service.runtime.devices.memory("cpu")[0] == 4 * MODEL_BYTES - MODEL_BYTES


def test_runtime_command_lists_bytes_and_unloads(memo, capsys):
    service = _service(4 * MODEL_BYTES)
    assert main(["runtime", "--load", "memo:a", "--load", "memo:b", "--json"], service) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"]: r["resident_bytes"] for r in rows} == {
        "memo/a@cpu": MODEL_BYTES,
        "memo/b@cpu": MODEL_BYTES,
    }
    assert main(["runtime", "--unload", "memo/a@cpu"], service) == 0
    out = capsys.readouterr().out
    assert "unloaded: memo/a@cpu" in out
    assert "memo/b@cpu (float32): idle, 0.1 MiB resident" in out
    assert main(["runtime", "--unload", "memo/zz@cpu"], service) == 2
    assert "no loaded model or engine 'memo/zz@cpu'" in capsys.readouterr().err
    assert main(["runtime", "--unload"], service) == 0
    assert service.describe_models() == []


def test_chunks_are_audio(memo):
    chunk = next(iter(_service(None).load("memo", "a").synthesize("x")))
    assert isinstance(chunk, AudioChunk) and chunk.samples.dtype == np.float32


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("compute.simulate_vram_mb", 0, "a number of MiB > 0"),
        ("compute.simulate_vram_mb", "8", "a number of MiB > 0"),
        ("compute.vram_headroom_mb", -1, "a number of MiB >= 0"),
        ("compute.vram_headroom_mb", True, "a number of MiB >= 0"),
        ("compute.working_margin", 0.5, "a factor >= 1"),
        ("compute.stream_in_flight", 0, "an integer >= 1"),
    ],
)
def test_memory_settings_are_checked_and_name_the_key(key, value, expected):
    with pytest.raises(EngineError) as caught:
        RuntimeService({key: value})
    assert caught.value.code == "invalid_request"
    assert caught.value.detail["field"] == key
    assert f"{key}: expected {expected}" in str(caught.value)


def test_loads_that_differ_only_in_options_are_accounted_apart(memo):
    service = _service(4 * MODEL_BYTES)
    first = service.load("memo", "a", options={"variant_of_test": 1})
    second = service.load("memo", "a", options={"variant_of_test": 2})
    assert first is not second and first.name == second.name == "memo/a@cpu"
    rows = [m for m in service.describe_models() if m["model"] == "a"]
    assert [r["resident_bytes"] for r in rows] == [MODEL_BYTES, MODEL_BYTES]  # not doubled
    assert [len(r["components"]) for r in rows] == [1, 1]
    assert first.engine.unload(first) == ["memo/a@cpu"]
    (row,) = [m for m in service.describe_models() if m["model"] == "a"]
    assert row["resident_bytes"] == MODEL_BYTES  # the survivor is still tracked
    assert service.runtime.devices.memory("cpu")[0] == 3 * MODEL_BYTES
    assert np.array_equal(_audio(service, "a", variant_of_test=2), _audio(_service(None), "a"))
    service.unload("memo")
    assert service.describe_models() == []
    assert service.runtime.devices.memory("cpu")[0] == 4 * MODEL_BYTES  # nothing left counted


def test_each_load_has_its_own_owner_and_unloads_by_it(memo):
    service = _service(4 * MODEL_BYTES)
    first = service.load("memo", "a", options={"variant_of_test": 1})
    second = service.load("memo", "a", options={"variant_of_test": 2})
    assert first.owner == 'memo/a@cpu[float32 {"variant_of_test": 1}]'
    assert {r["owner"] for r in service.runtime.manager.residency()} == {first.owner, second.owner}
    assert service.unload(second.owner) == ["memo/a@cpu"]
    assert [m["owner"] for m in service.describe_models()] == [first.owner]
