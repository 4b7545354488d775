"""Just enough of the protobuf (proto2) wire format to read ONNX files without protobuf.

Every length is checked against the bytes left in its enclosing message before anything is sliced
or allocated, so a corrupt file fails with an ``OnnxFormatError`` that names the byte offset and
the field, instead of reading past the end, hanging, or allocating what a bad length asks for.
Offsets are absolute positions in the buffer being read, which for a model file is the file.

A field of two bytes can become a Python object of a few hundred, so what the parser keeps is
also bounded: an ``Allowance`` is charged for every field kept and refuses the model once the
charges pass ``MEMORY_FACTOR`` x the buffer's size + ``MEMORY_FLOOR`` (the charges are set at or
above what CPython measurably spends on each kind of field).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import numpy as np

from mizuoto_sdk.errors import EngineUnavailable

VARINT, FIXED64, LENGTH_DELIMITED, START_GROUP, END_GROUP, FIXED32 = range(6)
_MASK64 = (1 << 64) - 1
_MAX_VARINT_BYTES = 10
_WIRE_NAMES = ("varint", "fixed64", "length-delimited", "start-group", "end-group", "fixed32")

Span = tuple[int, int]

MEMORY_FACTOR = 32
"""What the parsed model may take in Python memory, as a multiple of the file's size..."""
MEMORY_FLOOR = 64 * 2**20
"""...plus this many bytes, so any small model parses whatever its shape."""
MESSAGE_COST = 400  # a decoded message and the record made from it
FIELD_COST = 240  # a kept field: its value or span, its list slot, a tuple
_COST_PER_BYTE = {"string": 1, "int64": 8, "int32": 8, "uint64": 8, "float": 4, "double": 8}


class OnnxFormatError(EngineUnavailable, ValueError):
    """The bytes are not a well-formed ONNX model; the message says where reading went wrong.

    A broken model file is the operator's to replace, so the host reports ``engine_unavailable``
    (``load_onnx`` adds ``detail["file"]``); ``ValueError`` stays a base for library code.
    """

    def __init__(self, message: str, detail: Mapping[str, object] | None = None) -> None:
        super().__init__(message, {"reason": "onnx_unreadable", **(detail or {})})


Field = tuple[int, int, int, int, int, int]
"""One field as it sits on the wire: (number, wire type, offset of its key, payload start,
payload end, varint value). Plain tuples: the parser makes one per field, so they must be cheap."""


def read_varint(buf: memoryview, pos: int, end: int, where: str) -> tuple[int, int]:
    """The unsigned 64-bit value at ``pos`` and the position after it."""
    result = shift = 0
    start = pos
    while pos < end:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _MASK64, pos
        shift += 7
        if shift >= 7 * _MAX_VARINT_BYTES:
            raise OnnxFormatError(f"{where} at byte {start}: varint longer than 10 bytes")
    raise OnnxFormatError(f"{where} at byte {start}: varint cut off by the end of its message")


def _need(size: int, pos: int, end: int, where: str, what: str) -> None:
    if size > end - pos:
        raise OnnxFormatError(
            f"{where} at byte {pos}: {what} needs {size} bytes but only {end - pos} remain "
            "in its message (truncated or corrupt file)"
        )


def _skip_group(buf: memoryview, pos: int, end: int, number: int, where: str) -> int:
    """Skip a (deprecated) group without recursing; returns the position after its end tag."""
    open_groups = [number]
    while open_groups:
        offset = pos
        key, pos = read_varint(buf, pos, end, where)
        field, wire_type = key >> 3, key & 7
        if wire_type == END_GROUP:
            if field != open_groups.pop():
                raise OnnxFormatError(f"{where} at byte {offset}: end-group tag does not match")
        elif wire_type == START_GROUP:
            open_groups.append(field)
        else:
            pos = _skip_value(buf, pos, end, wire_type, offset, where)
    return pos


def _skip_value(
    buf: memoryview, pos: int, end: int, wire_type: int, offset: int, where: str, number: int = 0
) -> int:
    what = f"field {number} ({_WIRE_NAMES[wire_type] if wire_type < 6 else wire_type})"
    if wire_type == VARINT:
        return read_varint(buf, pos, end, where)[1]
    if wire_type in (FIXED64, FIXED32):
        size = 8 if wire_type == FIXED64 else 4
        _need(size, pos, end, where, what)
        return pos + size
    if wire_type == LENGTH_DELIMITED:
        length, pos = read_varint(buf, pos, end, where)
        _need(length, pos, end, where, what)
        return pos + length
    raise OnnxFormatError(f"{where} at byte {offset}: wire type {wire_type} is not valid here")


def iter_fields(
    buf: memoryview, start: int, end: int, where: str, schema: Schema | None = None
) -> Iterator[Field]:
    """The fields of the message in ``buf[start:end]``, in wire order; ``schema`` only names
    fields in error messages."""
    pos = start
    while pos < end:
        offset = pos
        key = buf[pos]
        if key < 0x80:  # one-byte keys and values are the common case; skip the general loop
            pos += 1
        else:
            key, pos = read_varint(buf, pos, end, where)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise OnnxFormatError(f"{where} at byte {offset}: field number 0 is not valid")
        if wire_type in (LENGTH_DELIMITED, VARINT):
            if pos < end and buf[pos] < 0x80:
                value = buf[pos]
                pos += 1
            else:
                value, pos = read_varint(buf, pos, end, where)
            if wire_type == VARINT:
                yield number, wire_type, offset, pos, pos, value
                continue
            if value > end - pos:
                name = schema.fields.get(number, ("",))[0] if schema else ""
                _need(value, pos, end, where, f"field {number} {name!r} (length-delimited)")
            yield number, wire_type, offset, pos, pos + value, 0
            pos += value
        elif wire_type == START_GROUP:
            after = _skip_group(buf, pos, end, number, where)
            yield number, wire_type, offset, pos, after, 0
            pos = after
        else:
            after = _skip_value(buf, pos, end, wire_type, offset, where, number)
            yield number, wire_type, offset, pos, after, 0
            pos = after


def packed_varints(buf: memoryview, start: int, end: int, where: str) -> np.ndarray:
    """Decode a packed run of varints with numpy (uint64), so large typed tensors stay fast."""
    data = np.frombuffer(buf[start:end], dtype=np.uint8)
    if data.size == 0:
        return np.empty(0, np.uint64)
    lasts = np.flatnonzero(data < 0x80)
    if lasts.size == 0 or lasts[-1] != data.size - 1:
        cut = start + (int(lasts[-1]) + 1 if lasts.size else 0)
        raise OnnxFormatError(f"{where}: packed varint at byte {cut} cut off by the field's end")
    firsts = np.concatenate(([0], lasts[:-1] + 1))
    lengths = lasts - firsts + 1
    if int(lengths.max()) > _MAX_VARINT_BYTES:
        bad = int(firsts[np.argmax(lengths > _MAX_VARINT_BYTES)])
        raise OnnxFormatError(f"{where}: varint at byte {start + bad} longer than 10 bytes")
    position = np.arange(data.size, dtype=np.uint64) - np.repeat(firsts, lengths).astype(np.uint64)
    groups = (data & 0x7F).astype(np.uint64) << (position * np.uint64(7))
    return np.bitwise_or.reduceat(groups, firsts)


def signed64(value: int) -> int:
    """A varint read as protobuf int64 (two's complement, no zigzag)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def signed32(value: int) -> int:
    """A varint read as protobuf int32: the low 32 bits, two's complement."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


class _Numbers:
    """A repeated numeric field, collected from any mix of packed runs and unpacked values."""

    __slots__ = ("chunks", "pending", "storage")

    def __init__(self, storage: str) -> None:
        self.storage = storage
        self.chunks: list[np.ndarray] = []
        self.pending: list[int | float] = []

    def add_run(self, run: np.ndarray) -> None:
        self._flush()
        self.chunks.append(run)

    def _flush(self) -> None:
        if self.pending:
            self.chunks.append(np.array(self.pending, dtype=self.storage))
            self.pending = []

    def array(self) -> np.ndarray:
        self._flush()
        if not self.chunks:
            return np.empty(0, self.storage)
        return np.concatenate(self.chunks) if len(self.chunks) > 1 else self.chunks[0]


_NUMERIC_WIRE = {
    "int32": VARINT,
    "int64": VARINT,
    "uint64": VARINT,
    "float": FIXED32,
    "double": FIXED64,
}
_STORAGE = {"int32": "<u8", "int64": "<u8", "uint64": "<u8", "float": "<f4", "double": "<f8"}
_SIGNED = {"int32": "<i4", "int64": "<i8"}


def _empty(dtype: str) -> np.ndarray:
    array = np.empty(0, dtype)
    array.flags.writeable = False
    return array


_EMPTY = {kind: _empty(_SIGNED.get(kind, storage)) for kind, storage in _STORAGE.items()}


class Allowance:
    """The Python memory a parse may still spend; charged per message and field kept.

    Each ``spend`` also checks the bound request's cancel every few thousand charges, so a call
    that parses a large graph stops when it is cancelled or times out.
    """

    __slots__ = ("charges", "check", "left", "limit")

    def __init__(self, size: int, check: Callable[[], None] | None = None) -> None:
        self.limit = MEMORY_FACTOR * size + MEMORY_FLOOR
        self.left = self.limit
        self.charges = 0
        self.check = check

    def spend(self, cost: int, where: str) -> None:
        self.left -= cost
        self.charges += 1
        if self.left < 0:
            raise OnnxFormatError(
                f"{where}: the model's records would take more than {self.limit} bytes of "
                f"memory ({MEMORY_FACTOR} x the file's size + {MEMORY_FLOOR >> 20} MiB); "
                "refused as a file built to exhaust memory"
            )
        if self.check is not None and self.charges % 4096 == 0:
            self.check()


class Schema:
    """One message type: its name (for errors) and, by field number, each field's name and kind.

    Kinds: int32, int64, uint64, float, double, string, bytes, message; a trailing ``*`` marks a
    repeated field (numeric ones are accepted packed and unpacked).
    """

    __slots__ = ("fields", "message", "repeated")

    def __init__(self, message: str, fields: Mapping[int, tuple[str, str]]) -> None:
        self.message = message
        self.fields = {
            n: (name, kind.rstrip("*"), kind.endswith("*")) for n, (name, kind) in fields.items()
        }
        self.repeated = [(name, base) for name, base, repeated in self.fields.values() if repeated]


class Message:
    """The decoded fields of one message.

    ``values`` holds the last value of each singular field present, every value of each repeated
    field (numeric ones as numpy arrays, int32/int64 signed; empty when absent), payload spans for
    embedded messages, and ``last_seen`` the order in which fields last appeared (for oneofs).
    """

    __slots__ = ("last_seen", "values")

    def __init__(self) -> None:
        # Any: a value's type is what the schema declares for its field (str, int, spans, ...)
        self.values: dict[str, Any] = {}
        self.last_seen: dict[str, int] = {}

    def get(self, name: str, default: object = None) -> Any:
        return self.values.get(name, default)


def decode(
    buf: memoryview,
    spans: Sequence[Span],
    schema: Schema,
    where: str,
    allowance: Allowance | None = None,
) -> Message:
    """Decode one message from ``spans``; several spans are occurrences of a singular embedded
    message, which protobuf merges as if they were one. ``allowance`` is charged for it."""
    context = f"{where} ({schema.message})"
    decoded = Message()
    values, last_seen, fields = decoded.values, decoded.last_seen, schema.fields
    sequence = 0
    if allowance is not None:
        allowance.spend(MESSAGE_COST, context)
    for start, end in spans:
        for field in iter_fields(buf, start, end, context, schema):
            entry = fields.get(field[0])
            if entry is not None:
                if allowance is not None:
                    per_byte = _COST_PER_BYTE.get(entry[1], 0)
                    allowance.spend(FIELD_COST + per_byte * (field[4] - field[3]), context)
                _store(buf, field, entry, values, context)
                last_seen[entry[0]] = sequence
                sequence += 1
    for name, base in schema.repeated:
        found = values.get(name)
        if base not in _NUMERIC_WIRE:
            if found is None:
                values[name] = []
        elif found is None:
            values[name] = _EMPTY[base]
        else:
            array = cast(_Numbers, found).array()  # a repeated number is stored as _Numbers
            if base == "int32":
                array = array.astype("<u4")
            values[name] = array.view(_SIGNED[base]) if base in _SIGNED else array
    return decoded


def _label(context: str, field: Field, name: str) -> str:
    return f"{context} field {field[0]} '{name}' at byte {field[2]}"


def _store(
    buf: memoryview, field: Field, entry: tuple[str, str, bool], values: dict, context: str
) -> None:
    name, base, repeated = entry
    _, wire_type, _, start, end, varint = field
    if base in _NUMERIC_WIRE:
        if repeated and wire_type == LENGTH_DELIMITED:
            run = _packed(buf, field, base, _label(context, field, name))
            values.setdefault(name, _Numbers(_STORAGE[base])).add_run(run)
            return
        _expect(field, _NUMERIC_WIRE[base], context, name)
        if base == "float":
            value = struct.unpack_from("<f", buf, start)[0]
        elif base == "double":
            value = struct.unpack_from("<d", buf, start)[0]
        else:
            value = varint
        if repeated:
            values.setdefault(name, _Numbers(_STORAGE[base])).pending.append(value)
        elif base == "int32":
            values[name] = signed32(value)
        else:
            values[name] = signed64(value) if base == "int64" else value
        return
    _expect(field, LENGTH_DELIMITED, context, name)
    if base == "message":
        span = (start, end)
        values.setdefault(name, []).append([span] if repeated else span)
        return
    raw = buf[start:end]
    payload: object = raw
    if base == "string":
        try:
            payload = str(raw, "utf-8")
        except UnicodeDecodeError as error:
            label = _label(context, field, name)
            raise OnnxFormatError(f"{label}: not UTF-8 ({error})") from None
    if repeated:
        values.setdefault(name, []).append(payload)
    else:
        values[name] = payload


def _expect(field: Field, wire_type: int, context: str, name: str) -> None:
    if field[1] != wire_type:
        raise OnnxFormatError(
            f"{_label(context, field, name)}: wire type {_WIRE_NAMES[field[1]]}, "
            f"expected {_WIRE_NAMES[wire_type]}"
        )


def _packed(buf: memoryview, field: Field, kind: str, label: str) -> np.ndarray:
    start, end = field[3], field[4]
    if _NUMERIC_WIRE[kind] == VARINT:
        return packed_varints(buf, start, end, label)
    size = 4 if kind == "float" else 8
    if (end - start) % size:
        raise OnnxFormatError(
            f"{label}: packed {kind} run of {end - start} bytes is not a multiple of {size}"
        )
    return np.frombuffer(buf[start:end], dtype=_STORAGE[kind])
