{%- set convert = cookiecutter.capabilities == "synthesize+convert" -%}
"""The engine's own behaviour, driven through the host as the server drives it.

The contract (test_contract.py) holds for every engine; these hold for this one. Change them with
the engine, and keep one test per promise: what comes out, which input is refused, and why.
"""

import numpy as np
import pytest

from {{ cookiecutter.__package_name }}.model import build
{%- if convert %}
from mizuoto_sdk import AudioChunk, InvalidRequest
{%- else %}
from mizuoto_sdk import InvalidRequest
{%- endif %}
from mizuoto_sdk.host import EngineRequest, RuntimeService

ENGINE_ID = {{ cookiecutter.slug | tojson }}
SAMPLE_RATE = 16_000


@pytest.fixture(scope="module")
def handle():
    service = RuntimeService()
    yield service.load(ENGINE_ID, device="cpu")
    service.unload()


def speak(handle, text, **params):
    return list(handle.synthesize(text, EngineRequest(params=params)))


def joined(chunks):
    return np.concatenate([chunk.samples for chunk in chunks])


def test_synthesize_streams_one_chunk_per_word(handle):
    chunks = speak(handle, "one two three", seed=1)
    assert [chunk.metadata["word"] for chunk in chunks] == ["one", "two", "three"]
    assert {chunk.sample_rate for chunk in chunks} == {SAMPLE_RATE}
    samples = joined(chunks)
    assert np.isfinite(samples).all() and 0 < np.abs(samples).max() <= 1


def test_the_seed_decides_the_audio(handle):
    first, again, other = (joined(speak(handle, "hello", seed=s)) for s in (7, 7, 8))
    assert np.array_equal(first, again) and not np.array_equal(first, other)


def test_speed_changes_the_length(handle):
    normal, fast = (joined(speak(handle, "hello", seed=1, speed=s)) for s in (1, 2))
    assert len(fast) == len(normal) // 2


@pytest.mark.parametrize("speed", [0, 5, "fast", True])
def test_a_bad_speed_is_an_invalid_request_naming_the_field(handle, speed):
    with pytest.raises(InvalidRequest) as raised:
        speak(handle, "hello", speed=speed)
    assert raised.value.detail["field"] == "params.speed"


def test_an_unknown_param_is_refused_with_the_known_ones_listed(handle):
    with pytest.raises(InvalidRequest) as raised:
        speak(handle, "hello", sped=2)
    assert raised.value.detail["field"] == "params.sped"
    assert "speed" in raised.value.detail["known"]
{%- if convert %}


def test_convert_streams_blocks_at_the_models_rate(handle):
    t = np.arange(8_000) / 8_000  # one second at 8 kHz, resampled by the engine
    audio = AudioChunk((0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 8_000)
    chunks = list(handle.convert(audio, EngineRequest(params={"seed": 1, "drive": 2.0})))
    assert len(chunks) == 10 and {chunk.sample_rate for chunk in chunks} == {SAMPLE_RATE}
    samples = joined(chunks)
    assert samples.shape == (SAMPLE_RATE,) and np.isfinite(samples).all()
    assert np.abs(samples).max() < 1  # soft-clipped


def test_convert_refuses_empty_audio_naming_the_field(handle):
    empty = AudioChunk(np.zeros(0, np.float32), SAMPLE_RATE)
    with pytest.raises(InvalidRequest) as raised:
        list(handle.convert(empty))
    assert raised.value.detail["field"] == "audio"
{%- endif %}
{%- if cookiecutter.uses_torch %}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_every_declared_dtype_loads_and_speaks(dtype):
    service = RuntimeService()
    try:
        samples = joined(speak(service.load(ENGINE_ID, device="cpu", dtype=dtype), "hi", seed=1))
    finally:
        service.unload()
    assert samples.dtype == np.float32 and np.isfinite(samples).all()


def test_a_checkpoint_in_model_dir_replaces_the_stand_in_weights(tmp_path):
    import torch
    from safetensors.torch import save_file

    stand_in = build(None, "cpu", "float32").state_dict()
    doubled = {name: 2 * tensor for name, tensor in stand_in.items()}
    save_file(doubled, tmp_path / "model.safetensors")
    loaded = build(tmp_path, "cpu", "float32").state_dict()
    assert all(torch.equal(loaded[name], 2 * tensor) for name, tensor in stand_in.items())
{%- else %}


def test_a_checkpoint_in_model_dir_replaces_the_stand_in_weights(tmp_path):
    stand_in = vars(build(None))
    np.savez(tmp_path / "model.npz", **{name: 2 * array for name, array in stand_in.items()})
    loaded = vars(build(tmp_path))
    assert all(np.array_equal(loaded[name], 2 * array) for name, array in stand_in.items())
{%- endif %}
