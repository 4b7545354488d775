"""Audio conversions the host applies: engine chunks to float32 mono numpy, and WAV files."""

from __future__ import annotations

import contextlib
import os
import secrets
import wave
from pathlib import Path
from typing import TYPE_CHECKING

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


def write_wav(path: str | Path, samples: np.ndarray, sample_rate: int) -> None:
    """Write mono float samples in [-1, 1] as a 16-bit PCM WAV file.

    A sample becomes ``round(x * 32768)`` clipped to [-32768, 32767]: the inverse of the
    ``int16 / 32768`` reading, so int16 audio read that way is written back bit for bit (the
    older ``x * 32767`` moved about one sample in 400 by one step). 1.0 itself clips to 32767.
    """
    import numpy as np

    scaled = np.asarray(samples, dtype=np.float64) * 32768.0
    pcm = np.clip(np.rint(scaled), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(int(sample_rate))
        out.writeframes(pcm.tobytes())
