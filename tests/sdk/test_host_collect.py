"""LocalModel.collect: a streaming capability read whole, as the same request's stream."""

from __future__ import annotations

import numpy as np
import pytest

from mizuoto_sdk import AudioChunk, EngineError
from mizuoto_sdk.host import EngineRequest, RuntimeService


@pytest.fixture
def sine():
    return RuntimeService().load("sine")


def test_collect_equals_the_concatenated_stream_of_the_same_request(sine):
    text = "one two three"
    chunks = list(sine.synthesize(text, EngineRequest(params={"seed": 5})))
    whole = sine.collect("synthesize", text, request=EngineRequest(params={"seed": 5}))
    assert isinstance(whole, AudioChunk) and whole.sample_rate == chunks[0].sample_rate
    assert whole.samples.dtype == np.float32
    assert whole.samples.tobytes() == np.concatenate([c.samples for c in chunks]).tobytes()


def test_collect_writes_the_timings_back_and_leaves_the_model_ready(sine):
    request = EngineRequest(params={"seed": 5})
    sine.collect("synthesize", "hello", request=request)
    assert request.applied["seed"] == 5 and "total" in request.timings
    assert sine.engine.state == "ready"


@pytest.mark.parametrize(
    ("arguments", "code", "field"),
    [
        (("sing", "hello"), "invalid_request", "capability"),
        (("synthesize",), "invalid_request", "text"),
        (("synthesize", ""), "invalid_request", "text"),
        (("synthesize", 3), "invalid_request", "text"),
        (
            ("convert", AudioChunk(np.zeros(160, np.float32), 16_000)),
            "capability_not_supported",
            None,
        ),
    ],
    ids=["unknown-capability", "missing-text", "empty-text", "text-not-str", "unsupported"],
)
def test_collect_rejects_bad_calls_with_typed_errors(sine, arguments, code, field):
    with pytest.raises(EngineError) as raised:
        sine.collect(*arguments)
    assert raised.value.code == code
    if field is not None:
        assert raised.value.detail["field"] == field
