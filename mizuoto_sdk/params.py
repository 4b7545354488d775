"""Request params as a declared schema: one ``Param`` per name an engine reads.

A manifest lists its params once; the host checks every request against them before the engine
runs and hands the engine the checked values, defaults filled in. The same declaration types a
command-line value (``Param.parse``), lists the params in ``mizuoto engines --json``
(``Param.describe``) and writes the engines' parameter tables in the docs.
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from mizuoto_sdk.errors import InvalidRequest

PARAM_TYPES: tuple[str, ...] = ("int", "float", "bool", "str", "path")
"""What a param may hold: ``path`` is a non-empty string or ``os.PathLike``, handed on as str."""

Value = int | float | bool | str
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_NUMBERS = ("int", "float")


def _check_name(instance: Param, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValueError(
            f"Param.name: expected a lowercase identifier such as 'top_k', got {value!r}"
        )


def _check_type(instance: Param, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in PARAM_TYPES:
        raise ValueError(
            f"Param {instance.name!r}.type: expected one of {', '.join(PARAM_TYPES)}, got {value!r}"
        )


def _choices(values: Iterable[Value] | None) -> tuple[Value, ...] | None:
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"Param.choices: expected a list of values or None, got {values!r}")
    return tuple(values)


def _bound(value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(f"Param minimum/maximum: expected a finite number or None, got {value!r}")
    return value


@attrs.frozen
class Param:
    """One request param: its name, type, default, allowed values, and a line of help.

    ``default`` None means the param is optional and the engine sees None unless the request
    gives it. ``minimum`` / ``maximum`` (inclusive; ``exclusive_minimum`` / ``exclusive_maximum``
    make them strict) bound an int or float; ``choices`` lists the only values allowed. A value of
    None in a request means "not given". Declaration mistakes raise at construction.
    """

    name: str = attrs.field(validator=_check_name)
    type: str = attrs.field(validator=_check_type)
    default: Value | None = None
    minimum: float | None = attrs.field(default=None, converter=_bound, kw_only=True)
    maximum: float | None = attrs.field(default=None, converter=_bound, kw_only=True)
    exclusive_minimum: bool = attrs.field(default=False, kw_only=True)
    exclusive_maximum: bool = attrs.field(default=False, kw_only=True)
    choices: tuple[Value, ...] | None = attrs.field(default=None, converter=_choices, kw_only=True)
    help: str = attrs.field(default="", kw_only=True)

    def __attrs_post_init__(self) -> None:
        where = f"Param {self.name!r}"
        ranged = self.minimum is not None or self.maximum is not None
        if ranged and self.type not in _NUMBERS:
            raise ValueError(f"{where}: minimum/maximum bound an int or float, not a {self.type}")
        if (self.exclusive_minimum and self.minimum is None) or (
            self.exclusive_maximum and self.maximum is None
        ):
            raise ValueError(f"{where}: an exclusive bound needs the bound itself")
        if self.minimum is not None and self.maximum is not None:
            strict = self.exclusive_minimum or self.exclusive_maximum
            if self.minimum > self.maximum or (strict and self.minimum == self.maximum):
                raise ValueError(f"{where}: the range {self.range_text()} holds no value")
        if self.choices is not None:
            if ranged:
                raise ValueError(f"{where}: give a range or choices, not both")
            if self.type in ("bool", "path") or not self.choices:
                raise ValueError(f"{where}: choices are one or more int, float or str values")
            checked = tuple(self._typed(choice, f"{where}.choices") for choice in self.choices)
            if len(set(checked)) != len(checked):
                raise ValueError(f"{where}.choices: {list(checked)} lists a value twice")
            object.__setattr__(self, "choices", checked)
        if not isinstance(self.help, str) or "\n" in self.help:
            raise ValueError(f"{where}.help: expected one line of text, got {self.help!r}")
        if self.default is not None:
            try:
                default = self.check(self.default)
            except InvalidRequest as error:
                raise ValueError(f"{where}.default: {error.message.partition(': ')[2]}") from None
            object.__setattr__(self, "default", default)

    @property
    def field(self) -> str:
        """Where an error about this param points: ``params.<name>``."""
        return f"params.{self.name}"

    def expected(self) -> str:
        """What a valid value is, in words: ``"a number in (0, 1]"``."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(choice) for choice in self.choices)
        ranged = self.range_text() is not None
        noun = {
            "int": "an integer",
            "float": "a number" if ranged else "a finite number",
            "bool": "true or false",
            "str": "a string",
            "path": "a non-empty path",
        }[self.type]
        if self.minimum is not None and self.maximum is not None:
            return f"{noun} in {self.range_text()}"
        if self.minimum is not None:
            return f"{noun} {'>' if self.exclusive_minimum else '>='} {_number_text(self.minimum)}"
        if self.maximum is not None:
            return f"{noun} {'<' if self.exclusive_maximum else '<='} {_number_text(self.maximum)}"
        return noun

    def range_text(self) -> str | None:
        """The range as an interval (``"[1, 4096]"``, ``"(0, inf)"``), or None when unbounded."""
        if self.minimum is None and self.maximum is None:
            return None
        low = "-inf" if self.minimum is None else _number_text(self.minimum)
        high = "inf" if self.maximum is None else _number_text(self.maximum)
        left = "(" if self.exclusive_minimum or self.minimum is None else "["
        right = ")" if self.exclusive_maximum or self.maximum is None else "]"
        return f"{left}{low}, {high}{right}"

    def check(self, value: object) -> Value | None:
        """``value`` as this param's type (None: the default), or an InvalidRequest naming
        ``params.<name>`` and what was expected."""
        if value is None:
            return self.default
        typed = self._typed(value, self.field)
        if self.choices is not None and typed not in self.choices:
            raise self._invalid(value)
        if not isinstance(typed, (int, float)):
            return typed
        if self.minimum is not None and (
            typed < self.minimum or (self.exclusive_minimum and typed == self.minimum)
        ):
            raise self._invalid(value)
        if self.maximum is not None and (
            typed > self.maximum or (self.exclusive_maximum and typed == self.maximum)
        ):
            raise self._invalid(value)
        return typed

    def parse(self, text: str) -> Value | None:
        """A command-line string as this param's value (``"0.7"`` -> 0.7, ``"yes"`` -> True),
        checked as ``check`` does; the errors are the same InvalidRequest."""
        if not isinstance(text, str):
            raise TypeError(f"{self.field}: parse takes the text of a value, got {text!r}")
        stripped = text.strip()
        value: object = text
        if self.type == "int":
            try:
                value = int(stripped)
            except ValueError:
                raise self._invalid(text) from None
        elif self.type == "float":
            try:
                value = float(stripped)
            except ValueError:
                raise self._invalid(text) from None
        elif self.type == "bool":
            if stripped.lower() not in _TRUE + _FALSE:
                raise self._invalid(text)
            value = stripped.lower() in _TRUE
        return self.check(value)

    def describe(self) -> dict[str, object]:
        """This declaration as JSON-ready data (``mizuoto engines --json``, forms, docs)."""
        described: dict[str, object] = {
            "name": self.name,
            "type": self.type,
            "default": self.default,
            "help": self.help,
        }
        if self.choices is not None:
            described["choices"] = list(self.choices)
        if self.minimum is not None:
            described["minimum"] = self.minimum
            described["exclusive_minimum"] = self.exclusive_minimum
        if self.maximum is not None:
            described["maximum"] = self.maximum
            described["exclusive_maximum"] = self.exclusive_maximum
        return described

    def _typed(self, value: object, field: str) -> Value:
        kind = self.type
        if kind == "int" and isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if kind == "float" and real and isinstance(value, numbers.Real) and math.isfinite(value):
            return float(value)
        if kind == "bool" and isinstance(value, bool):
            return value
        if kind == "str" and isinstance(value, str):
            return value
        if kind == "path" and isinstance(value, (str, os.PathLike)):
            path = os.fspath(value)
            if isinstance(path, str) and path:
                return path
        raise self._invalid(value, field)

    def _invalid(self, value: object, field: str | None = None) -> InvalidRequest:
        field = field or self.field
        return InvalidRequest(
            f"{field}: expected {self.expected()}, got {value!r}",
            {"field": field, "expected": self.expected()},
        )


SEED = Param(
    "seed",
    "int",
    None,
    minimum=0,
    maximum=2**63 - 1,
    help="the same seed gives the same output; none: a random one",
)
"""The host's own param: every engine accepts it, and none declares it."""

HOST_PARAMS: tuple[Param, ...] = (SEED,)


def check_declaration(values: Iterable[Param]) -> tuple[Param, ...]:
    """A manifest's ``params``: Param values, names unique, none of the host's own."""
    if isinstance(values, (str, Param)) or not isinstance(values, Iterable):
        raise ValueError(f"params: expected a list of Param, got {values!r}")
    items = tuple(values)
    wrong = [item for item in items if not isinstance(item, Param)]
    if wrong:
        raise ValueError(f"params: expected Param values, got {wrong!r}")
    names = [item.name for item in items]
    if len(set(names)) != len(names):
        raise ValueError(f"params: names {names} repeat")
    reserved = sorted(set(names) & {p.name for p in HOST_PARAMS})
    if reserved:
        raise ValueError(f"params: {reserved} belong to the host; every engine accepts them")
    return items


def check_params(
    declared: Iterable[Param], params: Mapping[str, object], engine_id: str = "engine"
) -> dict[str, object]:
    """``params`` checked against ``declared``: every declared name with its value or default,
    and the host's params (``seed``) that were given. An unknown name is an InvalidRequest that
    lists the known ones."""
    if not isinstance(params, Mapping):
        raise InvalidRequest(
            f"params: expected a mapping of name -> value, got {type(params).__name__}",
            {"field": "params"},
        )
    declared = tuple(declared)
    known = {p.name: p for p in (*declared, *HOST_PARAMS)}
    for name in params:
        if name not in known:
            raise _unknown(name, sorted(known), engine_id)
    checked: dict[str, object] = {p.name: p.check(params.get(p.name)) for p in declared}
    for host_param in HOST_PARAMS:
        if params.get(host_param.name) is not None:
            checked[host_param.name] = host_param.check(params[host_param.name])
    return checked


def _unknown(name: object, known: list[str], engine_id: str) -> InvalidRequest:
    close = difflib.get_close_matches(name, known, n=1) if isinstance(name, str) else []
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return InvalidRequest(
        f"params.{name}: engine {engine_id!r} has no param {name!r}{hint} "
        f"(known params: {', '.join(known)})",
        {"field": f"params.{name}", "known": known},
    )


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(value)
