"""Value types reject bad input with errors that name the field."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mizuoto_sdk import (
    ERROR_CODES,
    AudioChunk,
    EngineError,
    EngineManifest,
    LoadSpec,
    ModelEntry,
    Unsupported,
)
from mizuoto_sdk.host import error_from_code


def manifest(**overrides):
    fields = {
        "id": "x",
        "implementation": "pkg.mod:Engine",
        "models": [ModelEntry("m")],
        "capabilities": ["synthesize"],
        **overrides,
    }
    return EngineManifest(**fields)


def test_manifest_defaults_and_normalisation():
    m = manifest(dtypes=["bf16", "fp16", "fp32"])
    assert m.name == "x"
    assert m.dtypes == ("bfloat16", "float16", "float32")
    assert m.devices == ("cpu", "cuda", "mps", "xpu")
    assert m.model(None).id == "m"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"id": "Has Space"}, "EngineManifest.id"),
        ({"implementation": "no_colon"}, "EngineManifest.implementation"),
        ({"models": []}, "models"),
        ({"models": [ModelEntry("m"), ModelEntry("m")]}, "models"),
        ({"capabilities": ["sing"]}, "capabilities"),
        ({"capabilities": []}, "capabilities"),
        ({"devices": ["cpu", "cpu"]}, "devices"),
        ({"dtypes": ["int8"]}, "dtype"),
        ({"extras": {"x": 1}}, "extras"),
        ({"api_version": "one"}, "api_version"),
    ],
)
def test_manifest_validation_names_the_field(overrides, field):
    with pytest.raises((TypeError, ValueError)) as caught:
        manifest(**overrides)
    assert field in str(caught.value)


def test_manifest_is_frozen():
    with pytest.raises(AttributeError):
        manifest().id = "y"


def test_model_entry_files_must_be_a_package_resource_or_absolute():
    assert ModelEntry("m", files="pkg.data:weights/tiny").files == "pkg.data:weights/tiny"
    assert ModelEntry("m", files="/opt/models/tiny").files == "/opt/models/tiny"
    with pytest.raises(ValueError, match=r"ModelEntry\.files"):
        ModelEntry("m", files="relative/dir")


def test_audio_chunk_accepts_numpy_and_torch_floats_and_pcm_and_rejects_the_rest():
    assert AudioChunk(np.zeros(3, np.float16), 8000).duration == 3 / 8000
    assert AudioChunk(torch.zeros(2, 5, dtype=torch.bfloat16), 8000).duration == 5 / 8000
    assert AudioChunk(np.zeros(3, np.int16), 8000).duration == 3 / 8000
    assert AudioChunk(torch.zeros(2, 4, dtype=torch.int32), 8000).duration == 4 / 8000
    with pytest.raises(TypeError, match=r"AudioChunk\.samples"):
        AudioChunk([0.0, 1.0], 8000)
    for dtype in (np.uint16, np.int8, np.int64, np.bool_, np.complex64):
        with pytest.raises(TypeError, match=f"int16/int32 PCM, got {np.dtype(dtype)}"):
            AudioChunk(np.zeros(3, dtype), 8000)
    with pytest.raises(TypeError, match=r"got torch\.uint8"):
        AudioChunk(torch.zeros(3, dtype=torch.uint8), 8000)
    with pytest.raises(TypeError, match=r"ndim=3"):
        AudioChunk(np.zeros((1, 1, 3)), 8000)
    with pytest.raises(ValueError, match=r"AudioChunk\.sample_rate"):
        AudioChunk(np.zeros(3), 0)


def test_load_spec_validates_device_and_dtype():
    spec = LoadSpec("m", "cuda:1", "bf16")
    assert (spec.device_type, spec.dtype) == ("cuda", "bfloat16")
    with pytest.raises(ValueError, match="device"):
        LoadSpec("m", "gpu0", "float32")
    with pytest.raises(ValueError, match="dtype"):
        LoadSpec("m", "cpu", "int4")


def test_error_codes_are_a_closed_registry():
    assert Unsupported("x").code == "capability_not_supported"
    for code in ERROR_CODES:
        error = error_from_code(code, "message", {"k": 1})
        assert isinstance(error, EngineError) and error.code == code
        assert error.to_dict() == {"code": code, "message": "message", "detail": {"k": 1}}
    with pytest.raises(ValueError, match="unknown error code"):
        EngineError("x", code="made_up")
