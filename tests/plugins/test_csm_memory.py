"""csm under a VRAM budget that forces its backbone to stream: the same audio, bit for bit."""

from __future__ import annotations

import numpy as np

from mizuoto_sdk.host import EngineRequest, RuntimeService


def synthesized(service: RuntimeService) -> np.ndarray:
    request = EngineRequest(params={"max_frames": 3, "seed": 5})
    handle = service.load("csm")
    return np.concatenate([c.samples for c in handle.synthesize("Hi there", request)])


def test_a_streamed_backbone_speaks_exactly_as_the_resident_one():
    resident = synthesized(RuntimeService())
    service = RuntimeService({"compute.simulate_vram_mb": 0.5})
    streamed = synthesized(service)
    (row,) = service.describe_models()
    parts = {c["name"]: c for c in row["components"]}
    names = ("backbone", "depth_decoder", "embeddings", "codec_encoder", "codec_decoder")
    assert set(parts) == {f"csm/tiny:{part}" for part in (*names, "codec_quantizer")}
    assert parts["csm/tiny:backbone"]["streamed_bytes"] > 0  # its layers did not fit
    assert row["resident_bytes"] <= 2**19
    assert np.array_equal(streamed, resident)
