"""Runtime failures an operator can act on reach the caller with a registry code.

A broken checkpoint or ONNX file, weights that do not fit, a config the runtime cannot run and a
full cache must not come back as ``engine_error`` with a traceback; library code that catches
``ValueError`` must keep working.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from mizuoto_runtime.convert.onnx import OnnxFormatError, load_onnx
from mizuoto_runtime.lm import BufferCache, CacheFull, QwenConfig
from mizuoto_runtime.lm.config import UnsupportedModel
from mizuoto_runtime.weights.checkpoint import CheckpointError, load_state_dict
from mizuoto_runtime.weights.loading import LoadError, load_into
from mizuoto_sdk.errors import (
    ComputeUnavailable,
    EngineError,
    EngineUnavailable,
    InvalidRequest,
)
from mizuoto_sdk.host import RuntimeService

TINY = {
    "model_type": "qwen2",
    "hidden_size": 8,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "vocab_size": 16,
}


def _broken_checkpoint(tmp: Path) -> None:
    path = tmp / "model.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    load_state_dict(path)


def _broken_onnx(tmp: Path) -> None:
    path = tmp / "model.onnx"
    path.write_bytes(b"\x08\x07")  # ir_version 7 and nothing else: no graph
    load_onnx(path)


def _weights_that_do_not_fit(tmp: Path) -> None:
    load_into(nn.Linear(2, 2), {"weight": torch.zeros(3, 2), "extra": torch.zeros(1)})


def _unsupported_config(tmp: Path) -> None:
    QwenConfig.from_dict({**TINY, "hidden_act": "gelu"})


def _full_cache(tmp: Path) -> None:
    cache = BufferCache(QwenConfig.from_dict(TINY), 1, 4, dtype=torch.float32)
    cache.begin(5)


CASES = {
    "checkpoint": (_broken_checkpoint, CheckpointError, "engine_unavailable", "file"),
    "onnx": (_broken_onnx, OnnxFormatError, "engine_unavailable", "file"),
    "weights": (_weights_that_do_not_fit, LoadError, "engine_unavailable", "unexpected"),
    "config": (_unsupported_config, UnsupportedModel, "engine_unavailable", "key"),
    "cache": (_full_cache, CacheFull, "invalid_request", "field"),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_a_runtime_failure_in_load_reaches_the_caller_with_its_code(
    kind, host_engine, monkeypatch, tmp_path
):
    fail, error_type, code, field = CASES[kind]

    def load(self, spec, runtime, ctx):
        fail(tmp_path)

    monkeypatch.setattr(host_engine.module.HostEngine, "load", load)
    service = RuntimeService(discovery=host_engine.discovery)
    with pytest.raises(EngineError) as caught:
        service.load(host_engine.engine_id, "a")
    error = caught.value
    assert isinstance(error, error_type)
    assert error.code == code
    assert "traceback" not in error.detail
    assert error.detail[field]
    assert error.detail["reason"]
    assert error.detail["engine"] == host_engine.engine_id
    assert error.to_dict()["code"] == code


def test_a_full_cache_during_a_call_is_an_invalid_request_with_the_numbers(
    host_engine, monkeypatch
):
    def call(self, op, payload, ctx):
        _full_cache(Path())

    monkeypatch.setattr(host_engine.module.Loaded, "call", call)
    handle = RuntimeService(discovery=host_engine.discovery).load(host_engine.engine_id, "a")
    with pytest.raises(InvalidRequest) as caught:
        handle.call("echo", {})
    detail = caught.value.detail
    assert caught.value.code == "invalid_request"
    assert (detail["field"], detail["reason"]) == ("length", "cache_full")
    assert (detail["max_length"], detail["length"], detail["new"]) == (4, 0, 5)
    assert "traceback" not in detail


@pytest.mark.parametrize("kind", list(CASES))
def test_runtime_errors_stay_value_errors_for_library_callers(kind, tmp_path):
    fail, error_type, _, _ = CASES[kind]
    with pytest.raises(ValueError) as caught:
        fail(tmp_path)
    assert isinstance(caught.value, error_type)
    expected = InvalidRequest if kind == "cache" else EngineUnavailable
    assert isinstance(caught.value, expected)
    assert not isinstance(caught.value, ComputeUnavailable)


def test_the_error_detail_names_the_file_and_key(tmp_path):
    with pytest.raises(CheckpointError) as checkpoint:
        _broken_checkpoint(tmp_path)
    assert checkpoint.value.detail["file"] == str(tmp_path / "model.safetensors")
    with pytest.raises(OnnxFormatError) as onnx:
        _broken_onnx(tmp_path)
    assert onnx.value.detail["file"] == str(tmp_path / "model.onnx")
    with pytest.raises(UnsupportedModel) as config:
        _unsupported_config(tmp_path)
    assert config.value.detail["key"] == "hidden_act"
    with pytest.raises(LoadError) as weights:
        _weights_that_do_not_fit(tmp_path)
    detail = weights.value.detail
    assert (detail["mismatched"], detail["unexpected"]) == (["weight"], ["extra"])
    assert (detail["missing"], detail["missing_count"]) == (["bias"], 1)
