"""Turn the bytes of a model file into the records of ``_model``, one protobuf message at a time.

Each message type has a schema (field number -> name and kind) taken from ``onnx.in.proto``;
fields not in a schema are skipped. Structural checks that protobuf itself would not make (a
tensor's data matching its shape and fitting numpy, external data staying in the model's
directory, a bound on subgraph nesting) happen here, so a model that parses is one whose tensors
can be read. Every message read is charged to an ``Allowance`` (memory bounded by a multiple of
the file's size, cancel checked as the parse goes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import attrs
import numpy as np

from mizuoto_runtime.context import current_context
from mizuoto_runtime.convert._model import (
    AttributeValue,
    OnnxAttribute,
    OnnxGraph,
    OnnxModel,
    OnnxNode,
    OnnxOpset,
    OnnxValueInfo,
)
from mizuoto_runtime.convert._tensor import (
    DATA_TYPES,
    ExternalFiles,
    OnnxTensor,
    TensorData,
    checked_shape,
    external_slice,
    typed_values,
)
from mizuoto_runtime.convert._wire import (
    Allowance,
    Message,
    OnnxFormatError,
    Schema,
    Span,
    decode,
)

MAX_GRAPH_DEPTH = 32
"""Subgraphs (If/Loop/Scan bodies) nest at most this deep; deeper is treated as corrupt. Each
level is three messages deep, so protobuf's own limit of 100 allows about the same."""


_MODEL = Schema(
    "ModelProto",
    {
        1: ("ir_version", "int64"),
        2: ("producer_name", "string"),
        3: ("producer_version", "string"),
        4: ("domain", "string"),
        5: ("model_version", "int64"),
        7: ("graph", "message"),
        8: ("opset_import", "message*"),
        14: ("metadata_props", "message*"),
    },
)
_OPSET = Schema("OperatorSetIdProto", {1: ("domain", "string"), 2: ("version", "int64")})
_ENTRY = Schema("StringStringEntryProto", {1: ("key", "string"), 2: ("value", "string")})
_GRAPH = Schema(
    "GraphProto",
    {
        1: ("node", "message*"),
        2: ("name", "string"),
        5: ("initializer", "message*"),
        11: ("input", "message*"),
        12: ("output", "message*"),
        13: ("value_info", "message*"),
    },
)
_NODE = Schema(
    "NodeProto",
    {
        1: ("input", "string*"),
        2: ("output", "string*"),
        3: ("name", "string"),
        4: ("op_type", "string"),
        5: ("attribute", "message*"),
        7: ("domain", "string"),
    },
)
_ATTRIBUTE = Schema(
    "AttributeProto",
    {
        1: ("name", "string"),
        2: ("f", "float"),
        3: ("i", "int64"),
        4: ("s", "bytes"),
        5: ("t", "message"),
        6: ("g", "message"),
        7: ("floats", "float*"),
        8: ("ints", "int64*"),
        9: ("strings", "bytes*"),
        10: ("tensors", "message*"),
        11: ("graphs", "message*"),
        20: ("type", "int32"),
    },
)
_TENSOR = Schema(
    "TensorProto",
    {
        1: ("dims", "int64*"),
        2: ("data_type", "int32"),
        3: ("segment", "message"),
        4: ("float_data", "float*"),
        5: ("int32_data", "int32*"),
        6: ("string_data", "bytes*"),
        7: ("int64_data", "int64*"),
        8: ("name", "string"),
        9: ("raw_data", "bytes"),
        10: ("double_data", "double*"),
        11: ("uint64_data", "uint64*"),
        13: ("external_data", "message*"),
        14: ("data_location", "int32"),
    },
)
_VALUE_INFO = Schema("ValueInfoProto", {1: ("name", "string"), 2: ("type", "message")})
_TYPE = Schema(
    "TypeProto",
    {
        1: ("tensor", "message"),
        4: ("sequence", "message"),
        5: ("map", "message"),
        7: ("opaque", "message"),
        8: ("sparse_tensor", "message"),
        9: ("optional", "message"),
    },
)
_TENSOR_TYPE = Schema("TypeProto.Tensor", {1: ("elem_type", "int32"), 2: ("shape", "message")})
_SHAPE = Schema("TensorShapeProto", {1: ("dim", "message*")})
_DIMENSION = Schema(
    "TensorShapeProto.Dimension", {1: ("dim_value", "int64"), 2: ("dim_param", "string")}
)

# AttributeProto.AttributeType, lower-cased; the field each kind's value sits in.
_ATTRIBUTE_KINDS = {
    1: ("float", "f"),
    2: ("int", "i"),
    3: ("string", "s"),
    4: ("tensor", "t"),
    5: ("graph", "g"),
    6: ("floats", "floats"),
    7: ("ints", "ints"),
    8: ("strings", "strings"),
    9: ("tensors", "tensors"),
    10: ("graphs", "graphs"),
    11: ("sparse_tensor", ""),
    12: ("sparse_tensors", ""),
    13: ("type_proto", ""),
    14: ("type_protos", ""),
}
# Constant's other value attributes: the attribute kind each must have, the data type it becomes.
_CONSTANT_VALUES = {
    "value_float": ("float", 1),
    "value_floats": ("floats", 1),
    "value_int": ("int", 7),
    "value_ints": ("ints", 7),
    "value_string": ("string", 8),
    "value_strings": ("strings", 8),
}


class _Reader:
    """Builds the public records from one buffer; carries what every message needs to know."""

    def __init__(self, buf: memoryview, directory: Path | None) -> None:
        self.buf = buf
        self.directory = directory
        self.files = ExternalFiles()
        self.allowance = Allowance(len(buf), _check_cancel)

    def read(self, spans: Sequence[Span], schema: Schema, where: str) -> Message:
        return decode(self.buf, spans, schema, where, self.allowance)

    def model(self) -> OnnxModel:
        message = self.read([(0, len(self.buf))], _MODEL, "model")
        if "graph" not in message.values:
            raise OnnxFormatError("model (ModelProto): no graph (field 7); is this an ONNX file?")
        opsets = [
            self.read(s, _OPSET, f"model.opset_import[{index}]")
            for index, s in enumerate(message.get("opset_import"))
        ]
        entries = [
            self.read(s, _ENTRY, "model.metadata_props") for s in message.get("metadata_props")
        ]
        return OnnxModel(
            ir_version=message.get("ir_version", 0),
            producer_name=message.get("producer_name", ""),
            producer_version=message.get("producer_version", ""),
            domain=message.get("domain", ""),
            model_version=message.get("model_version", 0),
            opset_imports=tuple(
                OnnxOpset(m.get("domain", ""), m.get("version", 0)) for m in opsets
            ),
            metadata=tuple((m.get("key", ""), m.get("value", "")) for m in entries),
            graph=self.graph(message.get("graph"), "model.graph", 0),
        )

    def graph(self, spans: Sequence[Span], where: str, depth: int) -> OnnxGraph:
        if depth > MAX_GRAPH_DEPTH:
            raise OnnxFormatError(
                f"{where} (GraphProto at byte {spans[0][0]}): subgraphs nest deeper than "
                f"{MAX_GRAPH_DEPTH}"
            )
        message = self.read(spans, _GRAPH, where)
        nodes = tuple(
            self.node(s, f"{where}.node[{i}]", depth) for i, s in enumerate(message.get("node"))
        )
        infos = {
            key: tuple(
                self.value_info(s, f"{where}.{key}[{i}]") for i, s in enumerate(message.get(key))
            )
            for key in ("input", "output", "value_info")
        }
        return OnnxGraph(
            name=message.get("name", ""),
            nodes=nodes,
            initializers=tuple(
                self.tensor(s, f"{where}.initializer[{i}]")
                for i, s in enumerate(message.get("initializer"))
            ),
            constants=tuple(filter(None, map(_constant_tensor, nodes))),
            inputs=infos["input"],
            outputs=infos["output"],
            value_info=infos["value_info"],
        )

    def node(self, spans: Sequence[Span], where: str, depth: int) -> OnnxNode:
        message = self.read(spans, _NODE, where)
        return OnnxNode(
            name=message.get("name", ""),
            op_type=message.get("op_type", ""),
            domain=message.get("domain", ""),
            inputs=tuple(message.get("input")),
            outputs=tuple(message.get("output")),
            attributes=tuple(
                self.attribute(s, f"{where}.attribute[{i}]", depth)
                for i, s in enumerate(message.get("attribute"))
            ),
        )

    def attribute(self, spans: Sequence[Span], where: str, depth: int) -> OnnxAttribute:
        message = self.read(spans, _ATTRIBUTE, where)
        name = message.get("name", "")
        label = f"{where} (AttributeProto at byte {spans[0][0]}): attribute {name!r}"
        values = message.values
        code = message.get("type", 0)
        if code == 0:  # files from before AttributeProto.type: infer it from the value present
            present = [
                c for c, (_, key) in _ATTRIBUTE_KINDS.items() if key and _present(values, key)
            ]
            if len(present) != 1:
                raise OnnxFormatError(f"{label} has no type and {len(present)} values")
            code = present[0]
        if code not in _ATTRIBUTE_KINDS:
            raise OnnxFormatError(f"{label} has unknown type {code}")
        kind, key = _ATTRIBUTE_KINDS[code]
        if key in ("t", "g") and key not in values:
            raise OnnxFormatError(f"{label} is a {kind} but holds none")
        value: AttributeValue
        if key == "f":
            value = float(values.get("f", 0.0))
        elif key == "i":
            value = values.get("i", 0)
        elif key == "s":
            value = bytes(values.get("s", b""))
        elif key in ("floats", "ints"):
            value = tuple(values[key].tolist())
        elif key == "strings":
            value = tuple(bytes(item) for item in values[key])
        elif key == "t":
            value = self.tensor(values["t"], f"{where}.t")
        elif key == "tensors":
            value = tuple(
                self.tensor(s, f"{where}.tensors[{i}]") for i, s in enumerate(values[key])
            )
        elif key == "g":
            value = self.graph(values["g"], f"{where}.g", depth + 1)
        elif key == "graphs":
            value = tuple(
                self.graph(s, f"{where}.graphs[{i}]", depth + 1) for i, s in enumerate(values[key])
            )
        else:
            value = None
        return OnnxAttribute(name=name, kind=kind, value=value)

    def value_info(self, spans: Sequence[Span], where: str) -> OnnxValueInfo:
        message = self.read(spans, _VALUE_INFO, where)
        name = message.get("name", "")
        if "type" not in message.values:
            return OnnxValueInfo(name, "", None, None)
        cases = self.read(message.get("type"), _TYPE, f"{where}.type")
        if not cases.last_seen:
            return OnnxValueInfo(name, "", None, None)
        kind = max(cases.last_seen, key=cases.last_seen.__getitem__)  # a oneof: last one wins
        if kind not in ("tensor", "sparse_tensor"):
            return OnnxValueInfo(name, kind, None, None)
        tensor = self.read(cases.get(kind), _TENSOR_TYPE, f"{where}.type")
        shape = None
        if "shape" in tensor.values:
            dims = self.read(tensor.get("shape"), _SHAPE, f"{where}.shape")
            shape = tuple(
                self.dimension(s, f"{where}.shape.dim[{i}]") for i, s in enumerate(dims.get("dim"))
            )
        return OnnxValueInfo(name, kind, tensor.get("elem_type", 0), shape)

    def dimension(self, spans: Sequence[Span], where: str) -> int | str | None:
        message = self.read(spans, _DIMENSION, where)
        if not message.last_seen:
            return None
        return message.get(max(message.last_seen, key=message.last_seen.__getitem__))

    def tensor(self, spans: Sequence[Span], where: str) -> OnnxTensor:
        message = self.read(spans, _TENSOR, where)
        values = message.values
        name = message.get("name", "")
        label = f"{where} (tensor {name!r}, TensorProto at byte {spans[0][0]})"
        code = message.get("data_type", 0)
        if code not in DATA_TYPES:
            raise OnnxFormatError(f"{label}: data type {code} is not one this reader knows")
        data_type = DATA_TYPES[code]
        dims = checked_shape(values["dims"], data_type, label)
        if "segment" in values:
            raise OnnxFormatError(f"{label}: segmented tensors are not supported")
        count = math.prod(dims)
        location = message.get("data_location", 0)
        if location not in (0, 1):
            raise OnnxFormatError(f"{label}: data_location {location} is neither 0 nor 1")
        if location == 1:
            entries = [
                self.read(s, _ENTRY, f"{where}.external_data") for s in values["external_data"]
            ]
            pairs = {m.get("key", ""): m.get("value", "") for m in entries}
            data = TensorData(
                external=external_slice(pairs, data_type, count, self.directory, self.files, label)
            )
        elif "raw_data" in values:
            raw = values["raw_data"]
            expected = data_type.byte_count(count)
            if data_type.bits == 0 or len(raw) != expected:
                raise OnnxFormatError(
                    f"{label}: raw_data holds {len(raw)} bytes; "
                    f"{list(dims)} {data_type.name} needs {expected}"
                )
            data = TensorData(raw=raw)
        else:
            data = TensorData(typed=typed_values(values, data_type, count, label))
        return OnnxTensor(name=name, data_type=code, dims=dims, data=data)


def _check_cancel() -> None:
    ctx = current_context()
    if ctx is not None:
        ctx.check_cancel()


def _present(values: dict, key: str) -> bool:
    value = values.get(key)
    return value is not None and (key in ("f", "i", "s", "t", "g") or len(value) > 0)


def _constant_tensor(node: OnnxNode) -> OnnxTensor | None:
    """The tensor a Constant node outputs, whichever of its value attributes carries it."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or not node.outputs:
        return None
    for attribute in node.attributes:
        if attribute.name == "value" and isinstance(attribute.value, OnnxTensor):
            return attrs.evolve(attribute.value, name=node.outputs[0])
        kind, code = _CONSTANT_VALUES.get(attribute.name, ("", 0))
        if attribute.kind != kind:
            continue
        is_list = kind.endswith("s")
        # a list kind ("floats", "ints", "strings") holds a tuple
        items = cast("tuple[Any, ...]", attribute.value) if is_list else (attribute.value,)
        if code == 8:
            typed = np.empty(len(items), np.object_)
            typed[:] = [bytes(item) for item in items]
        else:
            typed = np.array(items, dtype=DATA_TYPES[code].numpy_dtype)
        typed.flags.writeable = False
        shape = (len(items),) if is_list else ()
        return OnnxTensor(node.outputs[0], code, shape, TensorData(typed=typed))
    return None


def read_model(buf: memoryview, directory: Path | None) -> OnnxModel:
    """Parse the ModelProto that fills ``buf``; ``directory`` is where external data is found."""
    return _Reader(buf, directory).model()
