"""Audio conversions the host applies: engine chunks to float32 mono numpy, and WAV files."""

from __future__ import annotations

import contextlib
import os
import secrets
import struct
import wave
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.types import PCM_SCALES, AudioChunk, sample_kind

if TYPE_CHECKING:
    import numpy as np


def to_mono_float32(samples: object) -> np.ndarray:
    """A float32 mono copy of ``samples`` (numpy or torch, ``[n]`` or ``[channels, n]``).

    Float samples keep their values; int16 / int32 PCM is divided by its full scale
    (``PCM_SCALES``), which is exact in float32 for int16.
    """
    import numpy as np

    if hasattr(samples, "detach"):  # a torch tensor, on any device and in any dtype
        tensor = samples.detach()
        if tensor.is_floating_point():
            tensor = tensor.float()
        samples = tensor.cpu().numpy()
    array = np.asarray(samples)
    kind = sample_kind(array.dtype)
    if kind is None:
        raise TypeError(
            f"samples must be floating point or int16/int32 PCM, got dtype {array.dtype}"
        )
    if array.ndim not in (1, 2):
        raise TypeError(f"samples must be shaped [n] or [channels, n], got shape {array.shape}")
    if kind != "float":
        # Division by a power of two is exact, so rounding to float32 happens once.
        array = array.astype(np.float64) / PCM_SCALES[kind]
    if array.ndim == 2:
        array = array.astype(np.float32).mean(axis=0)
    return np.array(array, dtype=np.float32)


def host_chunk(chunk: object, index: int) -> AudioChunk:
    """Check that an engine yielded an AudioChunk and convert it for the caller."""
    if not isinstance(chunk, AudioChunk):
        raise TypeError(
            f"chunk {index} is a {type(chunk).__module__}.{type(chunk).__qualname__}; engines "
            "must yield mizuoto_sdk.AudioChunk"
        )
    try:
        samples = to_mono_float32(chunk.samples)
    except TypeError as error:
        raise TypeError(f"chunk {index}: {error}") from None
    return AudioChunk(samples, chunk.sample_rate, chunk.metadata)


class AtomicFile:
    """A temporary file beside ``path`` that becomes ``path`` only if the ``with`` block succeeds.

    Creating it fails at once (OSError) when the folder is missing or not writable, before any
    expensive work; a failure inside the block removes the temporary file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        # The name itself is asked first (a name too long fails here, not at the final rename);
        # the temporary file has a short name of its own, so any name the file system accepts
        # works.
        with contextlib.suppress(FileNotFoundError):
            os.lstat(self.path)
        self.temporary = self.path.with_name(f".mizuoto-{secrets.token_hex(6)}.part")
        # os.open with 0o666 lets the umask decide the mode, as for any file the user writes.
        os.close(os.open(self.temporary, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))

    def __enter__(self) -> Path:
        return self.temporary

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        if kind is None:
            os.replace(self.temporary, self.path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.temporary)


def write_wav(path: str | Path | BinaryIO, samples: np.ndarray, sample_rate: int) -> None:
    """Write mono float samples in [-1, 1] as a 16-bit PCM WAV file (a path or a binary file).

    A sample becomes ``round(x * 32768)`` clipped to [-32768, 32767]: the inverse of the
    ``int16 / 32768`` reading, so int16 audio read that way is written back bit for bit (the
    older ``x * 32767`` moved about one sample in 400 by one step). 1.0 itself clips to 32767.
    """
    target = str(path) if isinstance(path, (str, os.PathLike)) else path
    with wave.open(target, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(int(sample_rate))
        out.writeframes(pcm16(samples))


def pcm16(samples: np.ndarray) -> bytes:
    """Mono float samples as little-endian 16-bit PCM, scaled as ``write_wav`` scales them."""
    import numpy as np

    scaled = np.asarray(samples, dtype=np.float64) * 32768.0
    return np.clip(np.rint(scaled), -32768, 32767).astype("<i2").tobytes()


UNKNOWN_SIZE = 0xFFFFFFFF
"""The RIFF and data sizes of a WAV whose length is not known while it is sent."""


def streamed_wav_header(sample_rate: int) -> bytes:
    """The 44-byte header of a mono 16-bit PCM WAV sent as it is made: its sizes are
    ``UNKNOWN_SIZE``, which players read as "until the stream ends"."""
    return (
        b"RIFF"
        + struct.pack("<I", UNKNOWN_SIZE)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, _PCM, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", UNKNOWN_SIZE)
    )


# WAVE format tags: integer PCM, IEEE float, and the extensible header that names one of them.
_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE
_PCM_DTYPES = {8: "u1", 16: "<i2", 32: "<i4"}


def read_wav(path: str | Path, field: str = "audio") -> AudioChunk:
    """A WAV file as an AudioChunk of float32 samples: ``[n]`` mono, ``[channels, n]`` otherwise.

    Reads PCM of 8 (unsigned), 16, 24 or 32 bits and 32- or 64-bit float, plain or in the
    extensible header; integer PCM is divided by its full scale (16-bit ``-32768`` is -1.0).
    Anything else is an InvalidRequest naming ``field`` and the file, without torch.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise InvalidRequest(
            f"{field}: {path} cannot be read: {error.strerror or error}",
            {"field": field, "path": str(path)},
        ) from None
    return parse_wav(data, field, str(path))


def parse_wav(data: bytes, field: str = "audio", source: str = "the upload") -> AudioChunk:
    """The bytes of a WAV file as ``read_wav`` reads them; ``source`` names them in errors."""
    import numpy as np

    def invalid(problem: str) -> InvalidRequest:
        return InvalidRequest(f"{field}: {source} {problem}", {"field": field, "path": source})

    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise invalid("is not a WAV file (no RIFF/WAVE header)")
    fmt, frames, offset = None, None, 12
    while offset + 8 <= len(data) and (fmt is None or frames is None):
        name, size = data[offset : offset + 4], struct.unpack_from("<I", data, offset + 4)[0]
        body = data[offset + 8 : offset + 8 + size]
        if name == b"fmt ":
            fmt = body
        elif name == b"data":
            frames = body  # a header that overstates the size (streamed WAV) keeps what is there
        offset += 8 + size + (size & 1)  # chunks are padded to an even length
    if fmt is None or len(fmt) < 16:
        raise invalid("has no format chunk")
    if frames is None:
        raise invalid("has no data chunk")
    tag, channels, rate = struct.unpack_from("<HHI", fmt)
    bits = struct.unpack_from("<H", fmt, 14)[0]
    if tag == _EXTENSIBLE and len(fmt) >= 26:
        tag = struct.unpack_from("<H", fmt, 24)[0]  # the sub-format GUID starts with the tag
    if channels < 1 or rate < 1:
        raise invalid(f"declares {channels} channels at {rate} Hz")
    width = bits // 8
    if bits % 8 or not (
        (tag == _PCM and bits in (8, 16, 24, 32)) or (tag == _FLOAT and bits in (32, 64))
    ):
        kind = {_PCM: "PCM", _FLOAT: "float"}.get(tag, f"format tag {tag:#x}")
        raise invalid(
            f"holds {bits}-bit {kind} audio; expected 8/16/24/32-bit PCM or 32/64-bit float"
        )
    usable = len(frames) - len(frames) % (width * channels)
    raw = np.frombuffer(frames[:usable], dtype="u1")
    if tag == _FLOAT:
        samples = raw.view("<f4" if bits == 32 else "<f8").astype(np.float32)
    elif bits == 24:  # three bytes, little-endian, sign from the top byte
        triples = raw.reshape(-1, 3).astype(np.int32)
        values = triples[:, 0] | (triples[:, 1] << 8) | (triples[:, 2] << 16)
        values = np.where(values >= 2**23, values - 2**24, values)
        samples = (values.astype(np.float64) / 2**23).astype(np.float32)
    else:
        values = raw.view(_PCM_DTYPES[bits]).astype(np.float64)
        if bits == 8:
            values -= 128  # 8-bit WAV is unsigned, silence at 128
        samples = (values / 2.0 ** (bits - 1)).astype(np.float32)
    samples = samples.reshape(-1, channels).T  # interleaved frames -> [channels, n]
    if not samples.shape[-1]:
        raise invalid("holds no audio")
    return AudioChunk(np.ascontiguousarray(samples[0] if channels == 1 else samples), rate)
