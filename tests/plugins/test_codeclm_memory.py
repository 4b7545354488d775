"""codeclm under a VRAM budget that forces its decoder to stream: the same audio, bit for bit."""

from __future__ import annotations

import numpy as np

from mizuoto_sdk.host import EngineRequest, RuntimeService

TEXT = "Hello from Mizuoto"


def synthesized(service: RuntimeService, **params) -> np.ndarray:
    request = EngineRequest(params={"max_frames": 24, "seed": 5, **params})
    handle = service.loaded("codeclm")
    return np.concatenate([c.samples for c in handle.synthesize(TEXT, request)])


def test_a_streamed_decoder_speaks_exactly_as_the_resident_one():
    resident = synthesized(RuntimeService())
    service = RuntimeService({"compute.simulate_vram_mb": 4})
    streamed = synthesized(service)
    (row,) = service.loaded_models()
    decoder = next(c for c in row["components"] if c["name"] == "codeclm/tiny:decoder")
    assert decoder["streamed_bytes"] > 0  # some layers did not fit and were streamed
    assert row["resident_bytes"] <= 4 * 2**20
    assert service.runtime.manager.streamer("cpu").copies > 0
    assert np.array_equal(streamed, resident)


def test_a_released_codeclm_is_placed_again_and_speaks_the_same():
    service = RuntimeService({"compute.simulate_vram_mb": 16})
    first = synthesized(service)
    sine = service.loaded("sine")
    list(sine.synthesize("hi", EngineRequest(params={"seed": 1})))
    freed = service.release_idle("cpu")
    assert "codeclm/tiny:decoder" in freed
    (row,) = [m for m in service.loaded_models() if m["engine"] == "codeclm"]
    assert row["resident_bytes"] == 0 and row["host_bytes"] > 0
    assert np.array_equal(synthesized(service), first)
