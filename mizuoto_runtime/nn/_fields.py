"""Reading the hand-written configs of checkpoints that have no transformers class (Vocos'
``config.yaml``, BigVGAN's ``config.json``): each reader returns the value or raises a
``ValueError`` naming the field and what it expected, which the family turns into
``EngineUnavailable``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

__all__ = ["boolean", "choice", "integers", "positive", "real", "section", "what"]


def positive(config: Mapping[str, Any], name: str, *, where: str = "") -> int:
    """A positive integer (``True`` is not one)."""
    value = _get(config, name, where)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}{name}: expected a positive integer, got {value!r}")
    return value


def integers(config: Mapping[str, Any], name: str, *, where: str = "") -> tuple[int, ...]:
    """A non-empty list of positive integers."""
    value = _get(config, name, where)
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ValueError(
            f"{where}{name}: expected a non-empty list of positive integers, got {value!r}"
        )
    return tuple(positive({name: v}, name, where=where) for v in value)


def real(config: Mapping[str, Any], name: str, *, where: str = "") -> float:
    """A finite number."""
    value = _get(config, name, where)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}{name}: expected a number, got {value!r}")
    return float(value)


def boolean(config: Mapping[str, Any], name: str, *, where: str = "") -> bool:
    """``true`` or ``false``, nothing that merely converts to one."""
    value = _get(config, name, where)
    if not isinstance(value, bool):
        raise ValueError(f"{where}{name}: expected true or false, got {value!r}")
    return value


def choice(config: Mapping[str, Any], name: str, options: Sequence[str], *, where: str = "") -> str:
    """One of ``options``, compared as upstream compares it (strings, exactly)."""
    value = _get(config, name, where)
    if value not in options or not isinstance(value, str):
        wanted = " or ".join(repr(o) for o in options)
        raise ValueError(f"{where}{name}: expected {wanted}, got {value!r}")
    return value


def section(config: Mapping[str, Any], name: str, *, where: str = "") -> Mapping[str, Any]:
    """A nested mapping."""
    value = _get(config, name, where)
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}{name}: expected a mapping, got {value!r}")
    return value


def what(value: object) -> str:
    """How an argument that is not what was asked for is named in an error."""
    if isinstance(value, Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor"
    return f"a {type(value).__name__}"


def _get(config: Mapping[str, Any], name: str, where: str) -> Any:
    if name not in config:
        raise ValueError(f"{where}{name}: missing")
    return config[name]
