"""The audio formats of the OpenAI speech route: each one an encoder that turns the engine's float32
mono chunks into the bytes of the answer, streamed where the format allows.

``wav`` (16-bit PCM at the engine's rate, sizes unknown as the native route sends it) and ``pcm``
(headerless 16-bit little-endian mono at 24 kHz, as OpenAI defines it) are sent chunk by chunk.
``pcm`` is resampled to 24 kHz by soxr's streaming resampler when the engine's rate differs
(torch-free, so a torch-free engine stays torch-free). ``flac``, ``mp3`` and ``opus`` (Ogg) are
encoded by libsndfile through soundfile, where the installed libsndfile has them, once the
synthesis has ended (libsndfile writes a whole file); mp3 and opus accept only some rates, so
other rates are resampled to 48 kHz first. ``aac`` has no encoder here: no well-kept Python
library without ffmpeg writes it, so it is refused with the formats that are available.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Protocol

from mizuoto_sdk.audio import pcm16, streamed_wav_header

if TYPE_CHECKING:
    import numpy as np

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
"""Every ``response_format`` OpenAI defines, in its order (``mp3`` is its default)."""
PCM_RATE = 24_000
"""The rate of ``pcm``: OpenAI's headerless 16-bit mono is 24 kHz."""
MEDIA_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
_LIBSNDFILE = {
    "flac": ("FLAC", "PCM_16"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
    "opus": ("OGG", "OPUS"),
}
_RATES = {
    "opus": frozenset({8000, 12000, 16000, 24000, 48000}),
    "mp3": frozenset({8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000}),
}
"""The rates libsndfile's Opus and MP3 encoders accept; any other is resampled to 48 kHz."""


class Encoder(Protocol):
    """Bytes of one answer: ``begin`` with the first chunk's rate, ``add`` per chunk, ``finish``."""

    streams: bool  # whether ``add`` returns the audio as it comes (else ``finish`` returns it all)

    def begin(self, sample_rate: int) -> bytes: ...

    def add(self, samples: np.ndarray) -> bytes: ...

    def finish(self) -> bytes: ...


def available() -> dict[str, str | None]:
    """Each format -> None where this server encodes it, else why not (for the 400's message)."""
    reasons: dict[str, str | None] = dict.fromkeys(FORMATS)
    reasons["aac"] = "no AAC encoder is installed"
    try:
        import soxr  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        for name in ("pcm", "mp3", "opus"):
            reasons[name] = "it needs soxr to resample (pip install soxr)"
    try:
        import soundfile  # type: ignore[import-untyped]
    except ImportError:
        for name in _LIBSNDFILE:
            reasons[name] = "it needs soundfile (pip install soundfile)"
        return reasons
    formats = soundfile.available_formats()
    for name, (container, subtype) in _LIBSNDFILE.items():
        if container not in formats or subtype not in soundfile.available_subtypes(container):
            reasons[name] = (
                f"the installed libsndfile ({soundfile.__libsndfile_version__}) cannot write it"
            )
    return reasons


def encoder(name: str) -> Encoder:
    """The encoder of an available format (``available()[name] is None``)."""
    if name == "wav":
        return _Wav()
    if name == "pcm":
        return _Pcm()
    return _Whole(name)


class _Wav:
    streams = True

    def begin(self, sample_rate: int) -> bytes:
        return streamed_wav_header(sample_rate)

    def add(self, samples: np.ndarray) -> bytes:
        return pcm16(samples)

    def finish(self) -> bytes:
        return b""


class _Pcm:
    """16-bit 24 kHz; another rate goes through one soxr stream, so that the chunks are
    resampled as one signal (no seam where two chunks meet)."""

    streams = True

    def __init__(self) -> None:
        self._resampler: object | None = None

    def begin(self, sample_rate: int) -> bytes:
        if sample_rate != PCM_RATE:
            import soxr

            self._resampler = soxr.ResampleStream(sample_rate, PCM_RATE, 1, dtype="float32")
        return b""

    def add(self, samples: np.ndarray) -> bytes:
        return pcm16(self._resample(samples, last=False))

    def finish(self) -> bytes:
        if self._resampler is None:
            return b""
        import numpy as np

        return pcm16(self._resample(np.zeros(0, np.float32), last=True))

    def _resample(self, samples: np.ndarray, *, last: bool) -> np.ndarray:
        if self._resampler is None:
            return samples
        resampled: np.ndarray = self._resampler.resample_chunk(samples, last=last)  # type: ignore[attr-defined]
        return resampled


class _Whole:
    """A libsndfile format, written once the audio is whole."""

    streams = False

    def __init__(self, name: str) -> None:
        self.name = name
        self._rate = 0
        self._parts: list[np.ndarray] = []

    def begin(self, sample_rate: int) -> bytes:
        self._rate = sample_rate
        return b""

    def add(self, samples: np.ndarray) -> bytes:
        self._parts.append(samples)
        return b""

    def finish(self) -> bytes:
        import numpy as np
        import soundfile

        audio = np.concatenate(self._parts) if self._parts else np.zeros(0, np.float32)
        rate = self._rate
        if self.name in _RATES and rate not in _RATES[self.name]:
            import soxr

            audio, rate = soxr.resample(audio, rate, 48_000), 48_000
        container, subtype = _LIBSNDFILE[self.name]
        samples = np.frombuffer(pcm16(audio), "<i2")  # the wav's own samples, scaled as it scales
        out = io.BytesIO()
        soundfile.write(out, samples, rate, format=container, subtype=subtype)
        return out.getvalue()
