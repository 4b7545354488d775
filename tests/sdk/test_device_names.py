"""Device names: one spelling per device, checked once in the contract layer, whoever asks."""

from __future__ import annotations

import pytest

from mizuoto_sdk import EngineError, LoadSpec
from mizuoto_sdk.host import RuntimeService, Settings
from mizuoto_sdk.manifest import canonical_device, device_type

SAME = [
    ("cpu", "cpu"),
    ("cpu:0", "cpu"),
    ("cpu:7", "cpu"),  # torch ignores a CPU index: there is one CPU
    ("cpu:01", "cpu"),
    ("cuda", "cuda"),  # the current CUDA device, as torch reads it
    ("cuda:0", "cuda:0"),
    ("cuda:01", "cuda:1"),
    ("xpu:3", "xpu:3"),
    ("mps:0", "mps"),
]
NOT_DEVICES = ["", "cpu:", "cpu:x", "gpu", "CPU", " cpu", "cuda:-1", "cuda:1.0", "cuda:²", "mps:1"]


@pytest.mark.parametrize(("spelling", "canonical"), SAME)
def test_each_spelling_of_a_device_has_one_canonical_name(spelling, canonical):
    assert canonical_device(spelling) == canonical
    assert device_type(spelling) == canonical.partition(":")[0]
    assert LoadSpec("m", spelling, "float32").device == canonical


@pytest.mark.parametrize("device", NOT_DEVICES)
def test_what_is_not_a_device_is_refused_naming_the_field(device):
    with pytest.raises(ValueError, match="device"):
        canonical_device(device)
    with pytest.raises(EngineError) as caught:
        Settings({"engines.sine.device": device})
    assert caught.value.code == "invalid_request"
    assert caught.value.detail["field"] == "engines.sine.device"


def test_every_spelling_of_the_cpu_loads_one_model():
    with RuntimeService() as service:
        models = {id(service.load("sine", device=d)) for d in ("cpu", "cpu:0", "cpu:7", "cpu:01")}
        assert len(models) == 1
        assert [m.spec.device for m in service.models()] == ["cpu"]


@pytest.mark.parametrize("device", ["cpu:x", "cuda:-1", "gpu", 7])
def test_a_bad_device_from_a_caller_is_its_invalid_request(device):
    with RuntimeService() as service, pytest.raises(EngineError) as caught:
        service.load("sine", device=device)
    assert caught.value.code == "invalid_request"
    assert caught.value.detail["field"] == "device"
    assert "device" in str(caught.value)


def test_a_device_setting_is_kept_in_its_one_spelling():
    assert Settings({"engines.sine.device": "cpu:0"}).engine("sine", "device") == "cpu"
    assert Settings({"engines.sine.device": "box/cpu:0"}).engine("sine", "device") == "box/cpu"
