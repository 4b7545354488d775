"""What a parsed ONNX model is: frozen records for graphs, nodes, attributes and value infos.

They mirror the ONNX protos closely enough that code written against onnx's own classes reads the
same, but hold plain Python values and ``OnnxTensor`` objects that decode their data on demand.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Union

import attrs

from mizuoto_runtime.convert._tensor import DATA_TYPES, OnnxTensor

AttributeValue = Union[
    float,
    int,
    bytes,
    OnnxTensor,
    "OnnxGraph",
    tuple[float, ...],
    tuple[int, ...],
    tuple[bytes, ...],
    tuple[OnnxTensor, ...],
    tuple["OnnxGraph", ...],
    None,
]


@attrs.frozen
class OnnxValueInfo:
    """A graph input, output or value_info entry.

    ``kind`` is the TypeProto case (``tensor``, ``sparse_tensor``, ``sequence``, ``map``,
    ``optional``, ``opaque``, or ``""`` when untyped); ``elem_type`` (0 when unset) and ``shape``
    are given for tensor kinds only. ``shape`` is None when the rank is unknown; each dimension is
    an int (dim_value), a str (dim_param) or None (unknown).
    """

    name: str
    kind: str
    elem_type: int | None
    shape: tuple[int | str | None, ...] | None

    @property
    def dtype_name(self) -> str | None:
        """The element type's lower-case ONNX name ("float32", "int64"), if known."""
        data_type = DATA_TYPES.get(self.elem_type or 0)
        return data_type.name if data_type else None


@attrs.frozen
class OnnxAttribute:
    """One node attribute. ``kind`` is the ONNX attribute type lower-cased (``float``, ``ints``,
    ``tensor``, ``graphs``...); ``value`` is None for the sparse-tensor and type-proto kinds,
    which this reader does not decode."""

    name: str
    kind: str
    value: AttributeValue


@attrs.frozen
class OnnxNode:
    """One node, with inputs and outputs named as in the file (``""`` marks an omitted input)."""

    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: tuple[OnnxAttribute, ...]

    def attribute(self, name: str) -> OnnxAttribute | None:
        """The attribute called ``name``, or None."""
        return next((item for item in self.attributes if item.name == name), None)


@attrs.frozen
class OnnxGraph:
    """A graph or subgraph. ``constants`` holds the tensors that Constant nodes produce, named
    after the node's output, so weights folded into Constant nodes are found with the rest."""

    name: str
    nodes: tuple[OnnxNode, ...]
    initializers: tuple[OnnxTensor, ...]
    constants: tuple[OnnxTensor, ...]
    inputs: tuple[OnnxValueInfo, ...]
    outputs: tuple[OnnxValueInfo, ...]
    value_info: tuple[OnnxValueInfo, ...]

    def subgraphs(self) -> Iterator[OnnxGraph]:
        """Graphs held by node attributes (If branches, Loop and Scan bodies), outermost first."""
        for node in self.nodes:
            for attribute in node.attributes:
                value = attribute.value  # kind "graph": a graph; "graphs": a tuple of them
                held = value if isinstance(value, tuple) else (value,)
                for graph in held:
                    if isinstance(graph, OnnxGraph):
                        yield graph
                        yield from graph.subgraphs()

    def tensors(self) -> Iterator[OnnxTensor]:
        """Initializers and Constant outputs of this graph, then of every subgraph."""
        for graph in (self, *self.subgraphs()):
            yield from graph.initializers
            yield from graph.constants


@attrs.frozen
class OnnxOpset:
    """One opset import; the default ONNX domain is ``""``."""

    domain: str
    version: int


@attrs.frozen
class OnnxModel:
    """A parsed model file. Tensors read their data from the file on demand."""

    ir_version: int
    producer_name: str
    producer_version: str
    domain: str
    model_version: int
    opset_imports: tuple[OnnxOpset, ...]
    metadata: tuple[tuple[str, str], ...]
    graph: OnnxGraph

    def tensors(self) -> Iterator[OnnxTensor]:
        """Every named tensor: initializers and Constant outputs, subgraphs included."""
        return self.graph.tensors()

    def opset_version(self, domain: str = "") -> int | None:
        """The imported opset version of ``domain`` (``""`` and ``ai.onnx`` are the same)."""
        wanted = "" if domain == "ai.onnx" else domain
        found = [item.version for item in self.opset_imports if item.domain in (wanted, domain)]
        return found[-1] if found else None
