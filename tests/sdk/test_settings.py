"""Settings: every value is checked when it is set, so an accepted one never fails a load."""

from __future__ import annotations

import math
import os

import pytest

from mizuoto_sdk import EngineError
from mizuoto_sdk.host import RuntimeService, Settings

NUMBER_KEYS = (
    "compute.simulate_vram_mb",
    "compute.vram_headroom_mb",
    "compute.working_margin",
)


@pytest.mark.parametrize("key", NUMBER_KEYS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 10**400, -(10**400)])
def test_numbers_that_are_not_finite_are_refused_when_set(key, value):
    with pytest.raises(EngineError) as caught:
        Settings({key: value})
    assert caught.value.code == "invalid_request"
    assert caught.value.detail["field"] == key
    assert "finite" in str(caught.value)
    settings = Settings()
    with pytest.raises(EngineError):
        settings.set(key, value)
    assert settings.get(key) is None


@pytest.mark.parametrize("value", [1e-9, 2**-21, 5e-324])
def test_a_simulated_device_smaller_than_a_byte_is_refused(value):
    with pytest.raises(EngineError, match=r"compute\.simulate_vram_mb: .*one byte") as caught:
        RuntimeService({"compute.simulate_vram_mb": value})
    assert caught.value.detail["field"] == "compute.simulate_vram_mb"


@pytest.mark.parametrize(
    "settings",
    [
        {"compute.simulate_vram_mb": 2**-20},
        {"compute.simulate_vram_mb": 1e12},
        {"compute.vram_headroom_mb": 1e300},
        {"compute.simulate_vram_mb": 8, "compute.vram_headroom_mb": 1e300},
        {"compute.simulate_vram_mb": 8, "compute.working_margin": 1e300},
    ],
)
def test_extreme_accepted_values_load_an_engine(settings):
    handle = RuntimeService(settings).load("sine")
    chunks = list(handle.synthesize("ab cd"))
    assert len(chunks) == 2


def test_voice_roots_are_stored_absolute_and_checked(tmp_path):
    settings = Settings({"voices.roots": [str(tmp_path), tmp_path / "b", "relative"]})
    assert settings.get("voices.roots") == (
        str(tmp_path),
        str(tmp_path / "b"),
        os.path.abspath("relative"),
    )
    assert Settings().get("voices.roots") == ()
    assert Settings({"voices.roots": str(tmp_path)}).get("voices.roots") == (str(tmp_path),)
    for bad in (7, [""], [3], {"a": 1}, ["a\0b"]):
        with pytest.raises(EngineError) as caught:
            Settings({"voices.roots": bad})
        assert caught.value.detail["field"] == "voices.roots"
