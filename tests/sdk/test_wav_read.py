"""read_wav: every common WAV sample format to float32 at full scale, and typed refusals."""

from __future__ import annotations

import struct
import wave

import numpy as np
import pytest

from mizuoto_sdk.audio import read_wav, write_wav
from mizuoto_sdk.errors import InvalidRequest


def riff(tag: int, channels: int, bits: int, frames: bytes, rate: int = 8000) -> bytes:
    width = bits // 8
    fmt = struct.pack(
        "<HHIIHH", tag, channels, rate, rate * width * channels, width * channels, bits
    )
    if tag == 0xFFFE:  # extensible: cbSize, valid bits, channel mask, sub-format GUID
        fmt += struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", 3) + b"\0" * 14
        tag = 3
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"LIST" + struct.pack("<I", 3) + b"abc\0"  # an odd chunk, padded, to skip
    body += b"data" + struct.pack("<I", len(frames)) + frames
    return b"RIFF" + struct.pack("<I", len(body)) + body


@pytest.mark.parametrize(
    ("tag", "bits", "frames", "expected"),
    [
        (1, 8, bytes([0, 128, 255]), [-1.0, 0.0, 127 / 128]),
        (1, 16, struct.pack("<3h", -32768, 0, 16384), [-1.0, 0.0, 0.5]),
        (1, 24, b"\x00\x00\x80" + b"\x00\x00\x00" + b"\x00\x00\x40", [-1.0, 0.0, 0.5]),
        (1, 32, struct.pack("<3i", -(2**31), 0, 2**30), [-1.0, 0.0, 0.5]),
        (3, 32, struct.pack("<3f", -0.25, 0.0, 1.5), [-0.25, 0.0, 1.5]),
        (0xFFFE, 32, struct.pack("<3f", 0.125, 0.0, -1.0), [0.125, 0.0, -1.0]),
    ],
    ids=["u8", "s16", "s24", "s32", "float32", "extensible-float32"],
)
def test_each_sample_format_reads_at_full_scale(tmp_path, tag, bits, frames, expected):
    path = tmp_path / "in.wav"
    path.write_bytes(riff(tag, 1, bits, frames))
    chunk = read_wav(path)
    assert chunk.sample_rate == 8000 and chunk.samples.dtype == np.float32
    assert chunk.samples.tolist() == expected


def test_channels_are_deinterleaved(tmp_path):
    path = tmp_path / "stereo.wav"
    path.write_bytes(riff(1, 2, 16, struct.pack("<4h", 0, 16384, -16384, 8192)))
    assert read_wav(path).samples.tolist() == [[0.0, -0.5], [0.5, 0.25]]


def test_what_write_wav_writes_reads_back(tmp_path):
    samples = np.linspace(-1, 0.99, 1000, dtype=np.float32)
    write_wav(tmp_path / "a.wav", samples, 22050)
    chunk = read_wav(tmp_path / "a.wav")
    assert chunk.sample_rate == 22050
    assert np.abs(chunk.samples - samples).max() <= 1 / 32768


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not audio at all", "is not a WAV file"),
        (riff(1, 1, 12, b"\0\0\0"), "12-bit PCM"),
        (riff(6, 1, 8, b"\0"), "format tag 0x6"),
        (riff(1, 1, 16, b""), "holds no audio"),
        (b"RIFF\x04\0\0\0WAVE", "no format chunk"),
    ],
    ids=["not-wav", "12-bit", "a-law", "empty", "no-fmt"],
)
def test_unreadable_files_are_invalid_requests_naming_the_file(tmp_path, content, message):
    path = tmp_path / "bad.wav"
    path.write_bytes(content)
    with pytest.raises(InvalidRequest, match=message) as caught:
        read_wav(path, field="voice")
    assert caught.value.detail == {"field": "voice", "path": str(path)}
    assert str(path) in str(caught.value)


def test_a_missing_file_is_an_invalid_request(tmp_path):
    with pytest.raises(InvalidRequest, match="cannot be read"):
        read_wav(tmp_path / "missing.wav")


def test_the_standard_library_reads_the_same_pcm(tmp_path):
    path = tmp_path / "std.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(struct.pack("<2h", 1000, -1000))
    assert read_wav(path).samples.tolist() == [1000 / 32768, -1000 / 32768]
