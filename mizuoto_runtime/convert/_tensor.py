"""ONNX tensors: element types, where the data lives, and how it becomes numpy or torch.

Data is checked against the tensor's shape when the model is parsed (sizes only, so that is cheap)
and decoded when ``numpy()`` is called: ``raw_data`` and external data as views of the mapped file,
typed fields (``float_data``, ``int32_data``...) from the arrays the parser already built.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
import re
from pathlib import Path, PurePosixPath, PureWindowsPath
from types import MappingProxyType
from typing import TYPE_CHECKING, cast

import attrs
import numpy as np

from mizuoto_runtime.convert._wire import OnnxFormatError
from mizuoto_runtime.weights.paths import allowed_trees, resolves_inside

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch


@attrs.frozen
class OnnxDataType:
    """One ONNX element type and how this reader hands it over.

    ``name`` is the ONNX name lower-cased, except FLOAT and DOUBLE, which read as ``float32`` and
    ``float64``. ``numpy_dtype`` is what ``OnnxTensor.numpy()`` returns; when numpy has no such
    type (bfloat16, the float8, float6 and float4 kinds) ``bit_pattern`` is True and the array
    holds each element's bits in an unsigned integer. 2- and 4-bit integers come one per byte as
    their values. ``bits`` is the width of one element in ``raw_data`` (0 for strings);
    ``torch_dtype`` names the torch dtype the bits are reinterpreted as, where torch has one.
    """

    code: int
    name: str
    numpy_dtype: str
    bits: int
    typed_field: str
    bit_pattern: bool = False
    torch_dtype: str | None = None

    def byte_count(self, count: int) -> int:
        """Bytes that ``count`` elements take in ``raw_data`` (sub-byte types packed LSB first)."""
        return (count * self.bits + 7) // 8


def _types(*rows: tuple) -> Mapping[int, OnnxDataType]:
    return MappingProxyType({row[0]: OnnxDataType(*row) for row in rows})


DATA_TYPES = _types(
    (1, "float32", "<f4", 32, "float_data"),
    (2, "uint8", "u1", 8, "int32_data"),
    (3, "int8", "i1", 8, "int32_data"),
    (4, "uint16", "<u2", 16, "int32_data"),
    (5, "int16", "<i2", 16, "int32_data"),
    (6, "int32", "<i4", 32, "int32_data"),
    (7, "int64", "<i8", 64, "int64_data"),
    (8, "string", "O", 0, "string_data"),
    (9, "bool", "?", 8, "int32_data"),
    (10, "float16", "<f2", 16, "int32_data"),
    (11, "float64", "<f8", 64, "double_data"),
    (12, "uint32", "<u4", 32, "uint64_data"),
    (13, "uint64", "<u8", 64, "uint64_data"),
    (14, "complex64", "<c8", 64, "float_data"),
    (15, "complex128", "<c16", 128, "double_data"),
    (16, "bfloat16", "<u2", 16, "int32_data", True, "bfloat16"),
    (17, "float8e4m3fn", "u1", 8, "int32_data", True, "float8_e4m3fn"),
    (18, "float8e4m3fnuz", "u1", 8, "int32_data", True, "float8_e4m3fnuz"),
    (19, "float8e5m2", "u1", 8, "int32_data", True, "float8_e5m2"),
    (20, "float8e5m2fnuz", "u1", 8, "int32_data", True, "float8_e5m2fnuz"),
    (21, "uint4", "u1", 4, "int32_data"),
    (22, "int4", "i1", 4, "int32_data"),
    (23, "float4e2m1", "u1", 4, "int32_data", True),
    (24, "float8e8m0", "u1", 8, "int32_data", True, "float8_e8m0fnu"),
    (25, "uint2", "u1", 2, "int32_data"),
    (26, "int2", "i1", 2, "int32_data"),
    (27, "float6e2m3", "u1", 6, "int32_data", True),
    (28, "float6e3m2", "u1", 6, "int32_data", True),
)
"""Every ONNX element type this reader decodes, by TensorProto.DataType code."""


MAX_DIMS = 64
"""Tensors have at most this many dimensions: numpy's (and torch's) own limit."""
_INDEX_LIMIT = int(np.iinfo(np.intp).max)


def checked_shape(dims: np.ndarray, data_type: OnnxDataType, label: str) -> tuple[int, ...]:
    """``dims`` as a tuple, once it is known that numpy and torch can hold that shape."""
    if dims.size > MAX_DIMS:
        raise OnnxFormatError(
            f"{label}: {dims.size} dimensions; numpy and torch hold at most {MAX_DIMS}"
        )
    shape = tuple(dims.tolist())
    if any(size < 0 for size in shape):
        raise OnnxFormatError(f"{label}: negative dimension in {list(shape)}")
    itemsize = np.dtype(data_type.numpy_dtype).itemsize
    if math.prod(size for size in shape if size) * itemsize > _INDEX_LIMIT:
        raise OnnxFormatError(
            f"{label}: shape {list(shape)} holds more elements than numpy can index"
        )
    return shape


class ExternalFiles:
    """Maps each external data file once per model, when a tensor first needs it."""

    def __init__(self) -> None:
        self._mapped: dict[Path, mmap.mmap | bytes] = {}

    def view(self, path: Path, offset: int, length: int, label: str) -> memoryview:
        mapped = self._mapped.get(path)
        if mapped is None:
            with path.open("rb") as file:
                size = os.fstat(file.fileno()).st_size
                mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
            self._mapped[path] = mapped
        if offset + length > len(mapped):
            raise OnnxFormatError(
                f"{label}: {path} ends before byte {offset + length}; "
                "did it change after the model was opened?"
            )
        return memoryview(mapped)[offset : offset + length]


@attrs.frozen
class ExternalSlice:
    """Where a tensor's bytes sit in an external data file (already checked to exist)."""

    path: Path
    offset: int
    length: int
    files: ExternalFiles = attrs.field(repr=False)

    def read(self, label: str) -> memoryview:
        return self.files.view(self.path, self.offset, self.length, label)


@attrs.frozen
class TensorData:
    """Exactly one of: a view of ``raw_data``, a decoded typed field, an external slice."""

    raw: memoryview | None = None
    typed: np.ndarray | None = None
    external: ExternalSlice | None = None


@attrs.frozen(eq=False)
class OnnxTensor:
    """A tensor from an initializer, an attribute or a Constant node.

    Equality is identity; compare ``numpy()`` results to compare contents. ``dims`` is ``()``
    for a scalar. ``numpy()`` returns read-only views of the file where it can.
    """

    name: str
    data_type: int
    dims: tuple[int, ...]
    _data: TensorData = attrs.field(repr=False)

    @property
    def dtype(self) -> OnnxDataType:
        """The element type: its name, and what numpy() and torch() return for it."""
        return DATA_TYPES[self.data_type]

    @property
    def is_external(self) -> bool:
        """True when the data sits in a separate file next to the model."""
        return self._data.external is not None

    def numpy(self) -> np.ndarray:
        """The values as a read-only array of ``dtype.numpy_dtype``, shaped ``dims``; bit
        patterns in an unsigned integer type when ``dtype.bit_pattern`` says numpy lacks it."""
        data = self._data
        if data.typed is not None:
            return data.typed.reshape(self.dims)
        label = f"tensor {self.name!r}"
        # exactly one of raw, typed, external is set
        raw = data.raw if data.raw is not None else cast(ExternalSlice, data.external).read(label)
        data_type = self.dtype
        count = math.prod(self.dims)
        if data_type.bits >= 8:
            flat = np.frombuffer(raw, dtype=data_type.numpy_dtype)
        else:
            flat = _unpack(np.frombuffer(raw, dtype=np.uint8), data_type, count)
            flat.flags.writeable = False
        return flat.reshape(self.dims)

    def torch(self) -> torch.Tensor:
        """The values as a torch tensor that owns its memory (a copy, since a tensor over the
        read-only file mapping would be writable in name only), in the real dtype where torch
        has it (bfloat16, float8 kinds); float4/float6 stay bit patterns in uint8."""
        import torch

        if self.data_type == 8:
            raise TypeError(f"tensor {self.name!r} holds strings, which torch cannot")
        tensor = torch.from_numpy(np.array(self.numpy(), copy=True))
        name = self.dtype.torch_dtype
        if name is not None and hasattr(torch, name):
            tensor = tensor.view(getattr(torch, name))
        return tensor

    def sha256(self) -> str:
        """Digest of the little-endian bytes of ``numpy()``; a string tensor hashes each element
        as its 8-byte little-endian length, then its bytes."""
        array = self.numpy()
        digest = hashlib.sha256()
        if self.data_type == 8:
            for item in array.reshape(-1):
                digest.update(len(item).to_bytes(8, "little"))
                digest.update(item)
        else:
            flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            digest.update(flat)  # type: ignore[arg-type]  # numpy types __buffer__ from Python 3.12
        return digest.hexdigest()


def _unpack(packed: np.ndarray, data_type: OnnxDataType, count: int) -> np.ndarray:
    """Sub-byte elements, packed LSB first, one per byte; signed kinds sign-extended."""
    bits = data_type.bits
    if bits == 6:  # four elements in every three bytes
        padded = np.zeros(-(-packed.size // 3) * 3, np.uint32)
        padded[: packed.size] = packed
        words = padded[0::3] | padded[1::3] << 8 | padded[2::3] << 16
        shifts = np.array([0, 6, 12, 18], np.uint32)
    else:
        words = packed
        shifts = np.arange(0, 8, bits, dtype=np.uint8)
    values = ((words[:, None] >> shifts) & ((1 << bits) - 1)).reshape(-1)[:count]
    if data_type.numpy_dtype == "i1":
        half = 1 << (bits - 1)
        return ((values.astype(np.int16) ^ half) - half).astype(np.int8)
    return values.astype(np.uint8)


def typed_values(values: dict, data_type: OnnxDataType, count: int, label: str) -> np.ndarray:
    """The elements held in a tensor's typed field, as ``numpy()`` will return them, flat."""
    field = data_type.typed_field
    source = values[field]
    complex_pairs = data_type.code in (14, 15)
    if data_type.code == 8:
        expected = count
    elif complex_pairs:
        expected = 2 * count
    elif data_type.bits in (2, 4):  # each int32 holds one packed byte
        expected = data_type.byte_count(count)
    else:
        expected = count
    if len(source) != expected:
        raise OnnxFormatError(
            f"{label}: {field} holds {len(source)} values; "
            f"{count} {data_type.name} elements need {expected}"
        )
    if data_type.code == 8:
        result = np.empty(count, object)
        result[:] = [bytes(item) for item in source]
        return result
    if complex_pairs:
        result = np.ascontiguousarray(source).view(data_type.numpy_dtype)
    elif data_type.bits in (2, 4):
        result = _unpack(source.astype(np.uint8), data_type, count)
    elif data_type.bits == 6:
        result = (source & 0x3F).astype(np.uint8)
    elif data_type.code == 9:
        result = source != 0
    elif field == "int32_data":  # bit patterns: keep the low bits, then reinterpret
        size = np.dtype(data_type.numpy_dtype).itemsize
        result = source.astype(f"<u{size}").view(data_type.numpy_dtype)
    else:
        result = source.astype(data_type.numpy_dtype, copy=False)
    result.flags.writeable = False
    return result


_DECIMAL = re.compile(r"[0-9]{1,20}")


def external_slice(
    pairs: Mapping[str, str],
    data_type: OnnxDataType,
    count: int,
    directory: Path | None,
    files: ExternalFiles,
    label: str,
) -> ExternalSlice:
    """Check an external_data reference and find its file; a location must resolve inside the
    model's directory (or its Hugging Face cache entry, whose blobs the directory links to), so
    a model cannot make the reader open files elsewhere."""
    location = pairs.get("location", "")
    if data_type.bits == 0:
        raise OnnxFormatError(f"{label}: string tensors cannot use external data")
    if directory is None:
        raise OnnxFormatError(
            f"{label}: uses external data; open the model with load_onnx(path)"
            " or pass parse_onnx(..., directory=) so the file can be found"
        )
    windows = PureWindowsPath(location)
    if not location or "\0" in location:
        raise OnnxFormatError(f"{label}: external data location {location!r} is not a file name")
    if PurePosixPath(location).is_absolute() or windows.is_absolute() or windows.drive:
        raise OnnxFormatError(
            f"{label}: external data location {location!r} is absolute; "
            "it must be relative to the model's directory"
        )
    try:  # inside the model's folder or its Hugging Face cache entry (weights.paths)
        base = directory.resolve()
        target = (base / location).resolve()
        inside = resolves_inside(directory / location, allowed_trees(directory))
        size = target.stat().st_size if inside and target.is_file() else None
    except (OSError, RuntimeError, ValueError) as error:
        raise OnnxFormatError(f"{label}: external data {location!r}: {error}") from None
    if not inside:
        raise OnnxFormatError(
            f"{label}: external data location {location!r} escapes the model's directory {base}"
        )
    if size is None:
        raise OnnxFormatError(f"{label}: external data file {target} does not exist")
    numbers = {}
    for key in ("offset", "length"):
        text = pairs.get(key)
        if text is not None and not _DECIMAL.fullmatch(text):
            raise OnnxFormatError(f"{label}: external data {key} {text!r} is not a decimal number")
        numbers[key] = None if text is None else int(text)
    offset = numbers["offset"] or 0
    length = size - offset if numbers["length"] is None else numbers["length"]
    expected = data_type.byte_count(count)
    if offset + length > size or length != expected:
        raise OnnxFormatError(
            f"{label}: external data {location!r} offset {offset} length "
            f"{length}: file has {size} bytes, tensor needs {expected}"
        )
    return ExternalSlice(target, offset, length, files)
