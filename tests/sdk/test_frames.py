"""The frame codec: what crosses a process boundary, and what is refused as malformed."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mizuoto_sdk.errors import ERROR_CODES, EngineError, error_from_code
from mizuoto_sdk.frames import (
    KINDS,
    MAX_DEPTH,
    FrameError,
    audio_fields,
    audio_from_fields,
    chunk_frame,
    chunk_from_frame,
    decode,
    encode,
    error_frame,
    error_from_frame,
)
from mizuoto_sdk.types import AudioChunk

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(
    kind=st.sampled_from(sorted(KINDS)),
    header=st.dictionaries(st.text(), JSON, max_size=5),
    payload=st.binary(max_size=256),
)
def test_a_frame_decodes_to_what_was_encoded(kind, header, payload):
    frame = decode(encode(kind, header, payload))
    assert (frame.kind, frame.header, frame.payload) == (kind, header, payload)


def test_the_layout_is_length_kind_header_length_header_payload():
    data = encode("chunk", {"a": 1}, b"\x01\x02")
    size, kind, header_size = struct.unpack_from(">IBI", data)
    assert size == len(data) - 4
    assert kind == KINDS["chunk"]
    assert data[9 : 9 + header_size] == b'{"a":1}'
    assert data[9 + header_size :] == b"\x01\x02"


def _frame(kind: int, header: bytes, payload: bytes = b"", size: int | None = None) -> bytes:
    body = struct.pack(">BI", kind, len(header)) + header + payload
    return struct.pack(">I", len(body) if size is None else size) + body


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x00\x00", "at least"),
        (_frame(KINDS["end"], b"{}", size=99), "follow its length"),
        (_frame(200, b"{}"), "unknown frame kind"),
        (_frame(KINDS["end"], b"{not json"), "not JSON"),
        (_frame(KINDS["end"], b"[1, 2]"), "not an object"),
        (_frame(KINDS["end"], b"\xff\xfe"), "not JSON"),
        (struct.pack(">IBI", 5, KINDS["end"], 50), "does not fit"),
    ],
)
def test_bytes_that_are_no_frame_are_a_frame_error(data, why):
    with pytest.raises(FrameError, match=why):
        decode(data)


def test_unknown_kinds_and_headers_json_cannot_hold_are_refused_when_encoding():
    with pytest.raises(ValueError, match="unknown frame kind"):
        encode("gossip", {})
    with pytest.raises(TypeError):
        encode("end", {"value": object()})
    with pytest.raises(ValueError):
        encode("end", {"value": float("nan")})


def test_a_chunk_crosses_as_float32_little_endian_with_its_rate_and_metadata():
    samples = np.linspace(-1, 1, 7, dtype=np.float32)
    data = chunk_frame(AudioChunk(samples, 22050, {"index": 3, "text": "hé"}), id=9)
    frame = decode(data)
    assert frame.header["id"] == 9
    assert frame.payload == samples.astype("<f4").tobytes()
    chunk = chunk_from_frame(frame)
    assert chunk.sample_rate == 22050
    assert dict(chunk.metadata) == {"index": 3, "text": "hé"}
    assert chunk.samples.dtype == np.float32
    np.testing.assert_array_equal(chunk.samples, samples)
    chunk.samples[0] = 5.0  # a copy the caller owns, not a view of the frame's bytes


def test_pcm_torch_and_multichannel_audio_arrive_as_float32_of_the_same_meaning():
    pcm = AudioChunk(np.array([[-32768, 0, 16384], [1, 2, 3]], dtype=np.int16), 8000)
    fields, payload = audio_fields(pcm)
    back = audio_from_fields(fields, payload)
    assert back.samples.shape == (2, 3)
    np.testing.assert_array_equal(back.samples[0], np.array([-1.0, 0.0, 0.5], dtype=np.float32))
    tensor = torch.tensor([0.25, -0.5], dtype=torch.bfloat16)
    fields, payload = audio_fields(AudioChunk(tensor, 16000))
    np.testing.assert_array_equal(
        audio_from_fields(fields, payload).samples, tensor.float().numpy()
    )


def test_metadata_json_cannot_hold_travels_as_its_text():
    class Odd:
        def __str__(self) -> str:
            return "odd"

    chunk = chunk_from_frame(decode(chunk_frame(AudioChunk(np.zeros(2), 8000, {"o": Odd()}))))
    assert dict(chunk.metadata) == {"o": "odd"}


@pytest.mark.parametrize(
    "header",
    [
        {"shape": [3], "sample_rate": 8000, "metadata": {}},  # 3 samples, 8 bytes sent below
        {"shape": [2], "sample_rate": 0, "metadata": {}},
        {"shape": [2], "sample_rate": True, "metadata": {}},
        {"shape": [2], "sample_rate": 8000, "metadata": []},
        {"shape": [1, 1, 2], "sample_rate": 8000, "metadata": {}},
        {"shape": [-2], "sample_rate": 8000, "metadata": {}},
        {"sample_rate": 8000, "metadata": {}},
    ],
)
def test_a_chunk_whose_header_and_payload_disagree_is_a_frame_error(header):
    with pytest.raises(FrameError):
        chunk_from_frame(decode(encode("chunk", header, b"\x00" * 8)))


@pytest.mark.parametrize("code", sorted(ERROR_CODES))
def test_every_error_code_comes_back_as_its_own_class(code):
    sent = error_from_code(code, f"{code}: something", {"field": "text", "n": 2})
    received = error_from_frame(decode(error_frame(sent, id=4)))
    assert type(received) is type(sent)
    assert (received.code, received.message, received.detail) == (
        code,
        f"{code}: something",
        {"field": "text", "n": 2},
    )


def test_an_error_frame_without_a_known_code_is_malformed():
    with pytest.raises(FrameError):
        error_from_frame(decode(encode("error", {"code": "nope", "message": "x", "detail": {}})))
    detail_json_cannot_hold = EngineError("x", {"path": object()})
    assert isinstance(
        error_from_frame(decode(error_frame(detail_json_cannot_hold))).detail["path"], str
    )


def test_a_header_nested_past_the_limit_is_a_frame_error_not_a_recursion_error():
    # What a user saw: a header 20,000 arrays deep raised an uncaught RecursionError.
    deep = b'{"a":' + b"[" * 20_000 + b"]" * 20_000 + b"}"
    with pytest.raises(FrameError, match=f"deeper than {MAX_DEPTH}"):
        decode(_frame(KINDS["hello"], deep))
    just = {"a": json.loads("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))}  # the object is one
    assert decode(encode("result", just)).header == just
    with pytest.raises(ValueError, match="deeper than"):
        encode("result", {"a": just})
    wide = {"text": "[" * 5000 + '\\"{' * 100, "list": [[1, 2]] * 200}  # brackets, not deep
    assert decode(encode("request", wide)).header == wide
