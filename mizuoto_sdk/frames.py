"""The frame codec every Mizuoto process boundary speaks: worker processes and remote engines.

A frame is a kind, a JSON header and optional raw bytes, laid out as

    >I  length of everything after these four bytes
    B   the kind, as one byte (``KINDS``)
    >I  length of the header
        the header: one JSON object, UTF-8
        the payload: raw bytes (for a chunk, float32 little-endian samples)

Audio never travels as a pickle: a chunk is its samples' bytes plus a header with its rate and
metadata, so a frame from a peer can be read without trusting it to run code. Parsing is bounded:
a frame is at most ``MAX_FRAME`` bytes and its header nests at most ``MAX_DEPTH`` arrays and
objects deep (JSON's own parser would recurse as deep as a peer likes, and end in a
RecursionError). Anything that does not parse is a ``FrameError``; the caller decides what a
malformed frame means (for a worker: the replica has failed; for an agent: the host is refused).
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Mapping
from typing import Any, NamedTuple

from mizuoto_sdk.errors import ERROR_CODES, EngineError, error_from_code
from mizuoto_sdk.types import PCM_SCALES, AudioChunk, sample_kind

__all__ = [
    "KINDS",
    "MAX_DEPTH",
    "MAX_FRAME",
    "Frame",
    "FrameError",
    "audio_fields",
    "audio_from_fields",
    "chunk_frame",
    "chunk_from_frame",
    "decode",
    "encode",
    "error_frame",
    "error_from_frame",
]

# One byte per kind. New kinds are appended; a number is never reused for another meaning.
KINDS: Mapping[str, int] = {
    # worker -> parent (and agent -> client)
    "hello": 1,
    "ready": 2,
    "failed": 3,
    "started": 4,
    "chunk": 5,
    "end": 6,
    "result": 7,
    "error": 8,
    "progress": 9,
    "heartbeat": 10,
    "refused": 11,
    # parent -> worker (and client -> agent)
    "request": 20,
    "next": 21,
    "cancel": 22,
    "close": 23,
    "text": 24,
    "shutdown": 25,
    # client -> agent (remote engines); an agent also sends ``file`` frames
    "open": 26,
    "load": 27,
    "unload": 28,
    "status": 29,
    "have": 30,
    "put": 31,
    "file": 32,
}
_NAMES = {number: name for name, number in KINDS.items()}
MAX_FRAME = 1 << 30
"""The largest frame read (1 GiB): a length beyond it is a malformed frame, not an allocation."""
MAX_DEPTH = 256
"""The deepest a header nests arrays and objects: deeper is a malformed frame (when decoding) or a
``ValueError`` (when encoding), never a RecursionError."""

_PREFIX = struct.Struct(">IBI")


class FrameError(ValueError):
    """Bytes that are not a frame: a wrong length, an unknown kind, a header that is no JSON
    object, a chunk whose payload does not match its header."""


class Frame(NamedTuple):
    kind: str
    header: dict[str, Any]
    payload: bytes = b""


def encode(kind: str, header: Mapping[str, object], payload: bytes = b"") -> bytes:
    """One frame as bytes. The header must be JSON-serializable (``TypeError`` otherwise) and
    nest at most ``MAX_DEPTH`` deep (``ValueError`` otherwise)."""
    number = KINDS.get(kind)
    if number is None:
        raise ValueError(f"unknown frame kind {kind!r}; known: {', '.join(KINDS)}")
    try:
        body = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    except RecursionError:
        raise ValueError(f"a {kind} frame's header nests deeper than {MAX_DEPTH}") from None
    if _too_deep(body):
        raise ValueError(f"a {kind} frame's header nests deeper than {MAX_DEPTH}")
    size = 5 + len(body) + len(payload)
    return b"".join((_PREFIX.pack(size, number, len(body)), body, payload))


def decode(data: bytes) -> Frame:
    """The frame in ``data``, which must hold exactly one."""
    if len(data) < _PREFIX.size:
        raise FrameError(f"a frame is at least {_PREFIX.size} bytes, got {len(data)}")
    size, number, header_size = _PREFIX.unpack_from(data)
    if size != len(data) - 4:
        raise FrameError(f"the frame says {size} bytes follow its length, {len(data) - 4} do")
    if size > MAX_FRAME:
        raise FrameError(f"a frame of {size} bytes is over the limit of {MAX_FRAME}")
    kind = _NAMES.get(number)
    if kind is None:
        raise FrameError(f"unknown frame kind {number}")
    if header_size > size - 5:
        raise FrameError(f"a header of {header_size} bytes does not fit a frame of {size}")
    start = _PREFIX.size
    text = data[start : start + header_size]
    if _too_deep(text):
        raise FrameError(f"the {kind} frame's header nests deeper than {MAX_DEPTH}")
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, ValueError) as error:
        raise FrameError(f"the {kind} frame's header is not JSON: {error}") from None
    if not isinstance(header, dict):
        raise FrameError(f"the {kind} frame's header is {type(header).__name__}, not an object")
    return Frame(kind, header, bytes(data[start + header_size :]))


def chunk_frame(chunk: AudioChunk, **header: object) -> bytes:
    """A ``chunk`` frame carrying ``chunk`` (see ``audio_fields``) besides ``header``."""
    fields, payload = audio_fields(chunk)
    return encode("chunk", {**header, **fields}, payload)


def chunk_from_frame(frame: Frame) -> AudioChunk:
    """The float32 chunk a ``chunk`` frame carries."""
    return audio_from_fields(frame.header, frame.payload)


def audio_fields(chunk: AudioChunk) -> tuple[dict[str, object], bytes]:
    """A chunk as header fields (``sample_rate``, ``shape``, ``metadata``) and payload bytes:
    its samples as float32 little-endian, ``[n]`` or ``[channels, n]``.

    Samples of any dtype a chunk allows (float, int16 / int32 PCM read at full scale, numpy or
    torch on any device) arrive as float32 of the same meaning. The metadata travels as JSON; a
    value JSON cannot hold is sent as its ``str``.
    """
    samples = _float32(chunk.samples)
    metadata = json.loads(json.dumps(dict(chunk.metadata), default=str))
    fields = {"sample_rate": chunk.sample_rate, "shape": list(samples.shape), "metadata": metadata}
    return fields, samples.tobytes()


def audio_from_fields(header: Mapping[str, Any], payload: bytes) -> AudioChunk:
    """The chunk that ``audio_fields`` wrote; ``FrameError`` when header and payload disagree."""
    import numpy as np

    shape, rate, metadata = header.get("shape"), header.get("sample_rate"), header.get("metadata")
    if (
        not isinstance(shape, list)
        or len(shape) not in (1, 2)
        or not all(_natural(n) for n in shape)
        or not isinstance(rate, int)
        or not _natural(rate)
        or rate == 0
    ):
        raise FrameError(f"audio needs a shape and a sample_rate, got {dict(header)!r}")
    if not isinstance(metadata, dict):
        raise FrameError("audio's metadata is not an object")
    count = shape[0] * (shape[1] if len(shape) == 2 else 1)
    if len(payload) != 4 * count:
        raise FrameError(f"audio of shape {shape} comes with {len(payload)} bytes")
    samples = np.frombuffer(payload, dtype="<f4").astype(np.float32).reshape(shape)
    return AudioChunk(samples, rate, metadata)


def _float32(samples: Any) -> Any:
    import numpy as np

    if hasattr(samples, "detach"):  # a torch tensor, on any device
        samples = samples.detach().cpu()
        samples = samples.float() if samples.is_floating_point() else samples
        samples = samples.numpy()
    kind = sample_kind(samples.dtype)
    array = np.asarray(samples)
    if kind in PCM_SCALES:
        array = array.astype(np.float64) / PCM_SCALES[kind]
    return np.ascontiguousarray(array, dtype="<f4")


def error_frame(error: EngineError, **header: object) -> bytes:
    """An ``error`` frame: the error's code, message and detail (made JSON-safe: a value JSON
    cannot hold, a NaN or an infinity among them, travels as its ``str``)."""
    try:
        detail = json.loads(json.dumps(error.detail, default=str, allow_nan=False))
    except ValueError:
        detail = json.loads(json.dumps(_finite(error.detail), default=str))
    return encode(
        "error", {**header, "code": error.code, "message": error.message, "detail": detail}
    )


def _finite(value: Any) -> Any:
    """``value`` with each float that is not finite replaced by its ``str``."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def error_from_frame(frame: Frame) -> EngineError:
    """The error an ``error`` frame carries, as the class registered for its code."""
    code, message, detail = (frame.header.get(k) for k in ("code", "message", "detail"))
    if code not in ERROR_CODES or not isinstance(message, str) or not isinstance(detail, dict):
        raise FrameError(
            f"an error frame needs a known code, a message and a detail: {frame.header!r}"
        )
    return error_from_code(str(code), message, detail)


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _too_deep(text: bytes) -> bool:
    """Whether the JSON in ``text`` nests more than ``MAX_DEPTH`` arrays and objects deep. Most
    headers hold too few brackets to be, and cost two counts; the others are scanned once, their
    strings (which may hold brackets) left out."""
    if text.count(b"[") + text.count(b"{") <= MAX_DEPTH:
        return False
    depth = 0
    for byte in _STRING.sub(b"", text).translate(None, _NOT_BRACKETS):
        if byte in b"[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        else:
            depth -= 1
    return False


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
