"""Values passed between the host and an engine."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from mizuoto_sdk.manifest import canonical_device, canonical_dtype, device_type


def _frozen_map(value: Mapping[str, object] | None) -> Mapping[str, object]:
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a mapping, got {type(value).__name__}")
    return MappingProxyType(dict(value))


# PCM integer dtypes and the value that maps to 1.0: full scale is 2**(bits - 1), the usual
# convention of WAV readers (int16 -32768 is -1.0 exactly; 32767 is just below 1.0).
PCM_SCALES = {"int16": 2**15, "int32": 2**31}


def sample_kind(dtype: object) -> str | None:
    """``"float"``, a PCM name from ``PCM_SCALES``, or None for ``dtype`` (numpy or torch)."""
    name = str(dtype).removeprefix("torch.")
    if name in PCM_SCALES:
        return name
    if "float" in name:  # float16/32/64, bfloat16
        return "float"
    return None


def _check_samples(instance: AudioChunk, attribute: attrs.Attribute[Any], value: object) -> None:
    ndim = getattr(value, "ndim", None)
    dtype = getattr(value, "dtype", None)
    if ndim not in (1, 2) or dtype is None:
        raise TypeError(
            "AudioChunk.samples: expected a numpy array or torch tensor shaped [n] or "
            f"[channels, n], got {type(value).__name__} with ndim={ndim}"
        )
    if sample_kind(dtype) is None:
        raise TypeError(
            f"AudioChunk.samples: expected a floating-point dtype or int16/int32 PCM, got {dtype}"
        )


def _check_rate(instance: AudioChunk, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"AudioChunk.sample_rate: expected a positive int (Hz), got {value!r}")


@attrs.frozen(eq=False)
class AudioChunk:
    """A piece of audio an engine yields.

    ``samples`` is a numpy array or torch tensor, mono ``[n]`` or ``[channels, n]``, on any
    device: any float dtype with full scale at 1.0, or int16 / int32 PCM, read as
    ``value / 2**15`` / ``value / 2**31`` (so int16 -32768 is -1.0). The host hands callers
    float32 mono numpy chunks.
    """

    samples: Any = attrs.field(validator=_check_samples)
    sample_rate: int = attrs.field(validator=_check_rate)
    metadata: Mapping[str, object] = attrs.field(factory=dict, converter=_frozen_map)

    @property
    def duration(self) -> float:
        """Seconds of audio in this chunk."""
        return int(self.samples.shape[-1]) / self.sample_rate


def _optional_path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)


@attrs.frozen
class LoadSpec:
    """What to load: which model, from where, on which device, at which precision."""

    model_id: str = attrs.field(validator=attrs.validators.instance_of(str))
    device: str = attrs.field(converter=canonical_device)  # "cpu:0" -> "cpu"
    dtype: str = attrs.field(converter=canonical_dtype)
    model_dir: Path | None = attrs.field(default=None, converter=_optional_path)
    variant: str | None = None
    options: Mapping[str, object] = attrs.field(factory=dict, converter=_frozen_map, hash=False)

    @property
    def device_type(self) -> str:
        """``"cuda"`` for ``"cuda:1"``."""
        return device_type(self.device)
