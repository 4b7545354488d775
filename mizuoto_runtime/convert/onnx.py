"""Read ONNX models straight from the protobuf wire format, with neither onnx nor protobuf.

Engines ported from ONNX checkpoints need the graph and the weights, not an ONNX runtime; reading
the file directly keeps those packages out of the dependency set. The file is memory-mapped and
``raw_data`` stays a view of it until a tensor is asked for, so opening a large model is cheap.
Anything malformed inside the file is an ``OnnxFormatError`` naming the byte offset and field.

    python -m mizuoto_runtime.convert.onnx MODEL.onnx --json
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from mizuoto_runtime.convert._model import (
    AttributeValue,
    OnnxAttribute,
    OnnxGraph,
    OnnxModel,
    OnnxNode,
    OnnxOpset,
    OnnxValueInfo,
)
from mizuoto_runtime.convert._reader import MAX_GRAPH_DEPTH, read_model
from mizuoto_runtime.convert._tensor import DATA_TYPES, OnnxDataType, OnnxTensor
from mizuoto_runtime.convert._wire import OnnxFormatError

__all__ = [
    "DATA_TYPES",
    "MAX_GRAPH_DEPTH",
    "AttributeValue",
    "OnnxAttribute",
    "OnnxDataType",
    "OnnxFormatError",
    "OnnxGraph",
    "OnnxModel",
    "OnnxNode",
    "OnnxOpset",
    "OnnxTensor",
    "OnnxValueInfo",
    "describe",
    "load_onnx",
    "main",
    "parse_onnx",
]


def parse_onnx(
    data: bytes | memoryview | mmap.mmap, directory: str | os.PathLike | None = None
) -> OnnxModel:
    """Parse a model held in memory. ``directory`` is where external data files are looked up;
    without it a model with external data is rejected. Tensors keep views of ``data``."""
    buf = memoryview(data).toreadonly().cast("B")
    return read_model(buf, Path(directory) if directory is not None else None)


def load_onnx(path: str | os.PathLike) -> OnnxModel:
    """Parse the model file at ``path`` (memory-mapped). Raises OSError when the file cannot be
    read and OnnxFormatError when its contents are not a well-formed ONNX model."""
    path = Path(path)
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    try:
        return parse_onnx(data, path.parent)
    except OnnxFormatError as error:
        error.detail.setdefault("file", str(path))
        raise


def _tensor_summary(tensor: OnnxTensor) -> dict[str, object]:
    return {"dtype": tensor.dtype.name, "shape": list(tensor.dims), "sha256": tensor.sha256()}


def _json_value(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, OnnxTensor):
        return _tensor_summary(value)
    if isinstance(value, OnnxGraph):
        return _describe_graph(value)
    if isinstance(value, tuple):
        return [_json_value(item) for item in value]
    return value


def _describe_node(node: OnnxNode) -> dict[str, object]:
    return {
        "name": node.name,
        "op_type": node.op_type,
        "domain": node.domain,
        "inputs": list(node.inputs),
        "outputs": list(node.outputs),
        "attributes": [
            {"name": a.name, "type": a.kind, "value": _json_value(a.value)} for a in node.attributes
        ],
    }


def _describe_value(info: OnnxValueInfo) -> dict[str, object]:
    shape = None if info.shape is None else list(info.shape)
    return {"name": info.name, "kind": info.kind, "dtype": info.dtype_name, "shape": shape}


def _describe_graph(graph: OnnxGraph) -> dict[str, object]:
    return {
        "name": graph.name,
        "inputs": [_describe_value(info) for info in graph.inputs],
        "outputs": [_describe_value(info) for info in graph.outputs],
        "nodes": [_describe_node(node) for node in graph.nodes],
    }


def describe(model: OnnxModel) -> dict[str, object]:
    """The model as JSON-friendly data, what ``--json`` prints: the main graph's name, inputs,
    outputs and nodes (a graph attribute nests the same summary of its subgraph; a tensor
    attribute gives dtype, shape and sha256), then every tensor, subgraphs' included."""
    return {
        "ir_version": model.ir_version,
        "producer_name": model.producer_name,
        "producer_version": model.producer_version,
        "opset_imports": [{"domain": o.domain, "version": o.version} for o in model.opset_imports],
        **_describe_graph(model.graph),
        "tensors": [{"name": t.name, **_tensor_summary(t)} for t in model.tensors()],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Print a model's nodes and tensors; exit status 2 for a missing or corrupt file."""
    parser = argparse.ArgumentParser(
        prog="python -m mizuoto_runtime.convert.onnx", description=main.__doc__
    )
    parser.add_argument("model", help="path to an .onnx file")
    parser.add_argument("--json", action="store_true", help="print every node and tensor as JSON")
    options = parser.parse_args(argv)
    try:
        model = load_onnx(options.model)
        summary = describe(model) if options.json else None
    except (OSError, ValueError, MemoryError, RecursionError) as error:  # OnnxFormatError too
        print(f"error: {options.model}: {error}", file=sys.stderr)
        return 2
    if summary is not None:
        json.dump(summary, sys.stdout, indent=1)
        print()
        return 0
    tensors = list(model.tensors())
    print(
        f"{options.model}: ir_version {model.ir_version}, producer {model.producer_name!r}, "
        f"{len(model.graph.nodes)} nodes, {len(tensors)} tensors"
    )
    for tensor in tensors:
        print(f"  {tensor.name}  {tensor.dtype.name}{list(tensor.dims)}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the reader went away (`... | head`); stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
