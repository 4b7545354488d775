"""Validators the manifest's value types share (private to mizuoto_sdk)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import attrs

ENGINE_ID = re.compile(r"[a-z][a-z0-9_-]{0,63}")
IMPLEMENTATION = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def matches(
    pattern: re.Pattern[str], example: str
) -> Callable[[object, attrs.Attribute[Any], object], None]:
    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            owner = type(instance).__name__
            raise ValueError(
                f"{owner}.{attribute.name}: expected something like {example!r}, got {value!r}"
            )

    return check
