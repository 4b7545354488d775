"""mizuoto_runtime.convert.onnx reads what the onnx package reads, and fails cleanly otherwise.

Every expectation comes from the real onnx package in the same process (onnx.load, numpy_helper,
helper.get_attribute_value, the reference evaluator), never from hard-coded outputs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from small_models import field, varint

from mizuoto_runtime.convert.onnx import (
    MAX_GRAPH_DEPTH,
    OnnxFormatError,
    OnnxGraph,
    OnnxTensor,
    describe,
    load_onnx,
    parse_onnx,
)

onnx = pytest.importorskip("onnx")
from onnx import AttributeProto, TensorProto, helper, numpy_helper  # noqa: E402

# --- onnx's view, in this reader's conventions -----------------------------------------------


def onnx_type_name(code: int) -> str:
    name = TensorProto.DataType.Name(code).lower()
    return {"float": "float32", "double": "float64"}.get(name, name)


def reference_array(proto: TensorProto) -> np.ndarray:
    """numpy_helper.to_array, with strings as bytes, 2/4-bit integers as int8/uint8 values and
    the float types numpy lacks (ml_dtypes in onnx) as unsigned bit patterns, as the reader
    documents."""
    array = numpy_helper.to_array(proto)
    if proto.data_type == TensorProto.STRING:  # onnx decodes to str; string_data is bytes
        return np.array([s.encode() for s in array.reshape(-1)] or [], object).reshape(array.shape)
    if array.dtype.name in ("int4", "int2"):
        return array.astype(np.int8)
    if array.dtype.name in ("uint4", "uint2"):
        return array.astype(np.uint8)
    if array.dtype.type.__module__.startswith("ml_dtypes"):
        return array.view(f"u{array.dtype.itemsize}")
    return array


def reference_sha256(array: np.ndarray) -> str:
    digest = hashlib.sha256()
    if array.dtype == object:
        for item in array.reshape(-1):
            digest.update(len(item).to_bytes(8, "little") + item)
    else:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def assert_same_tensor(ours: OnnxTensor, proto: TensorProto, name: str | None = None) -> None:
    expected, actual = reference_array(proto), ours.numpy()
    assert ours.name == (proto.name if name is None else name)
    assert ours.dtype.name == onnx_type_name(proto.data_type)
    assert ours.dims == tuple(proto.dims)
    assert (actual.shape, actual.dtype) == (expected.shape, expected.dtype), ours.name
    if expected.dtype == object:
        assert actual.tolist() == expected.tolist()
    else:
        assert actual.tobytes() == expected.tobytes(), ours.name
    assert ours.sha256() == reference_sha256(expected)


def assert_same_value_info(ours, proto) -> None:
    assert ours.name == proto.name
    case = proto.type.WhichOneof("value") if proto.HasField("type") else None
    assert ours.kind == (case or "").removesuffix("_type")
    if case in ("tensor_type", "sparse_tensor_type"):
        tensor_type = getattr(proto.type, case)
        assert ours.elem_type == tensor_type.elem_type
        if not tensor_type.HasField("shape"):
            assert ours.shape is None
        else:
            dims = tensor_type.shape.dim
            assert ours.shape == tuple(
                getattr(d, d.WhichOneof("value")) if d.WhichOneof("value") else None for d in dims
            )


def assert_same_attribute_value(kind: str, ours, theirs) -> None:
    if kind in ("tensor", "graph"):
        ours, theirs = (ours,), (theirs,)
    if kind in ("tensor", "tensors"):
        assert len(ours) == len(theirs)
        for tensor, proto in zip(ours, theirs, strict=True):
            assert_same_tensor(tensor, proto)
    elif kind in ("graph", "graphs"):
        assert len(ours) == len(theirs)
        for graph, proto in zip(ours, theirs, strict=True):
            assert_same_graph(graph, proto)
    elif kind in ("floats", "ints", "strings"):
        assert ours == tuple(theirs)
    else:
        assert ours == theirs


def assert_same_graph(ours: OnnxGraph, proto) -> None:
    assert ours.name == proto.name
    assert len(ours.nodes) == len(proto.node)
    for node, expected in zip(ours.nodes, proto.node, strict=True):
        fields = ("name", "op_type", "domain")
        assert [getattr(node, f) for f in fields] == [getattr(expected, f) for f in fields]
        assert (node.inputs, node.outputs) == (tuple(expected.input), tuple(expected.output))
        assert [a.name for a in node.attributes] == [a.name for a in expected.attribute]
        for attribute, reference in zip(node.attributes, expected.attribute, strict=True):
            kind = AttributeProto.AttributeType.Name(reference.type).lower()
            assert attribute.kind == kind
            value = helper.get_attribute_value(reference)
            assert_same_attribute_value(kind, attribute.value, value)
    assert len(ours.initializers) == len(proto.initializer)
    for tensor, expected in zip(ours.initializers, proto.initializer, strict=True):
        assert_same_tensor(tensor, expected)
    for infos, expected in (
        (ours.inputs, proto.input),
        (ours.outputs, proto.output),
        (ours.value_info, proto.value_info),
    ):
        assert len(infos) == len(expected)
        for info, reference in zip(infos, expected, strict=True):
            assert_same_value_info(info, reference)


def assert_same_model(ours, proto) -> None:
    assert ours.ir_version == proto.ir_version
    fields = ("producer_name", "producer_version", "domain", "model_version")
    assert [getattr(ours, f) for f in fields] == [getattr(proto, f) for f in fields]
    assert [(o.domain, o.version) for o in ours.opset_imports] == [
        (o.domain, o.version) for o in proto.opset_import
    ]
    assert list(ours.metadata) == [(p.key, p.value) for p in proto.metadata_props]
    assert_same_graph(ours.graph, proto.graph)


def reference_tensors(graph) -> list[tuple[str, TensorProto]]:
    """Initializers and Constant outputs, then each subgraph's, in the order tensors() documents;
    Constant scalars and lists become tensors the way onnx's reference evaluator makes them."""
    found = [(t.name, t) for t in graph.initializer]
    for node in graph.node:
        if node.op_type == "Constant":
            attribute = node.attribute[0]
            value = helper.get_attribute_value(attribute)
            if attribute.name != "value":
                value = numpy_helper.from_array(_evaluate_constant(node))
            found.append((node.output[0], value))
    for node in graph.node:
        for attribute in node.attribute:
            value = helper.get_attribute_value(attribute)
            for subgraph in value if attribute.type == AttributeProto.GRAPHS else [value]:
                if attribute.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
                    found += reference_tensors(subgraph)
    return found


def _evaluate_constant(node) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    output = helper.make_tensor_value_info(node.output[0], TensorProto.UNDEFINED, None)
    graph = helper.make_graph([node], "constant", [], [output])
    (value,) = ReferenceEvaluator(helper.make_model(graph)).run(None, {})
    if value.dtype.kind == "U":
        value = np.array([s.encode() for s in value.reshape(-1)], object).reshape(value.shape)
    return value


# --- models --------------------------------------------------------------------------------

SAMPLES = {
    "float": [0.5, -1.0, 2.0, 4.0, 0.25, -1.5],
    "positive": [0.5, 1.0, 2.0, 4.0, 0.25, 8.0],
    "signed": [-3, 1, 0, 2, -1, 127],
    "int4": [-8, 7, 0, 3, -1, 1],
    "int2": [-2, 1, 0, 1, -1, 0],
    "unsigned": [3, 1, 0, 2, 255, 7],
    "uint4": [15, 1, 0, 8, 3, 7],
    "uint2": [3, 1, 0, 2, 1, 0],
}


def sample_array(code: int, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    dtype = helper.tensor_dtype_to_np_dtype(code)
    name = TensorProto.DataType.Name(code)
    count = int(np.prod(shape))
    if code == TensorProto.STRING:
        values = np.array([b"a", b"", "\u00fc".encode(), b"x y", b"bc", b"d"], object)
    elif code == TensorProto.BOOL:
        values = np.array([True, False, True, True, False, True])
    elif name.startswith("COMPLEX"):
        values = np.array(SAMPLES["float"]) + 1j * np.array(SAMPLES["positive"])
    elif name == "INT64":
        values = np.array([-(2**40), 2**62, -1, 0, 5, -(2**63)], np.int64)
    elif name == "UINT64":
        values = np.array([2**64 - 1, 2**63, 1, 0, 5, 7], np.uint64)
    elif name in ("INT4", "INT2", "UINT4", "UINT2"):
        values = np.array(SAMPLES[name.lower()])
    elif name.startswith("INT"):
        values = np.array(SAMPLES["signed"])
    elif name.startswith("UINT"):
        values = np.array(SAMPLES["unsigned"])
    else:
        values = np.array(SAMPLES["positive" if name == "FLOAT8E8M0" else "float"])
    return np.resize(values, count).astype(dtype).reshape(shape)


ALL_CODES = [code for name, code in TensorProto.DataType.items() if name != "UNDEFINED"]


def dtype_model(code: int, raw: bool):
    tensors = []
    for shape in ((2, 3), (), (0, 3)):
        array = sample_array(code, shape)
        name = f"t{len(tensors)}"
        if raw:
            tensors.append(numpy_helper.from_array(array, name))
        else:
            tensors.append(helper.make_tensor(name, code, shape, array.reshape(-1), raw=False))
    graph = helper.make_graph([], "dtypes", [], [], tensors)
    return helper.make_model(graph)


def feature_model():
    """A model with every attribute type, an If with nested subgraphs, Constant nodes of every
    kind, raw and typed initializers, value infos with every kind of dimension, metadata."""
    float_type, int_type = TensorProto.FLOAT, TensorProto.INT64
    inner = helper.make_graph(
        [helper.make_node("Constant", [], ["deep"], value_ints=[3, -4])],
        "inner",
        [],
        [helper.make_tensor_value_info("deep", int_type, [2])],
    )
    then_branch = helper.make_graph(
        [
            helper.make_node("Constant", [], ["then_c"], value_float=2.5),
            helper.make_node("If", ["cond"], ["deep"], then_branch=inner, else_branch=inner),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("then_c", float_type, [])],
        [numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "then_w")],
    )
    else_branch = helper.make_graph(
        [
            helper.make_node(
                "Constant",
                [],
                ["else_c"],
                value=helper.make_tensor("v", TensorProto.FLOAT16, [2], [1.0, -2.0], raw=False),
            )
        ],
        "else",
        [],
        [helper.make_tensor_value_info("else_c", TensorProto.FLOAT16, [2])],
    )
    small = helper.make_graph([], "small", [], [])
    custom = helper.make_node(
        "Custom",
        ["x", "", "w"],
        ["y", "z"],
        name="custom",
        domain="test.domain",
        f=0.1,
        i=-7,
        s=b"bytes \x00\xff",
        t=numpy_helper.from_array(sample_array(TensorProto.BFLOAT16), "attr_t"),
        g=small,
        floats=[1.0, -2.5, 3.25],
        ints=[1, -2, 2**62, -(2**63)],
        strings=[b"a", "\u00e9".encode(), b""],
        tensors=[
            numpy_helper.from_array(sample_array(TensorProto.INT4), "i4"),
            helper.make_tensor("f16", TensorProto.FLOAT16, [3], [0.5, 1.0, 2.0], raw=False),
        ],
        graphs=[small, small],
    )
    constants = [
        helper.make_node("Constant", [], [f"c_{name}"], **{name: value})
        for name, value in (
            ("value_float", 1.5),
            ("value_floats", [1.0, 2.5]),
            ("value_int", -3),
            ("value_ints", [1, -2, 2**40]),
            ("value_string", "h\u00e9"),
            ("value_strings", ["a", "bc"]),
            ("value", numpy_helper.from_array(np.arange(4, dtype=np.int32), "ignored")),
        )
    ]
    branch = helper.make_node(
        "If", ["cond"], ["out"], name="if", then_branch=then_branch, else_branch=else_branch
    )
    graph = helper.make_graph(
        [custom, *constants, branch],
        "main",
        [
            helper.make_tensor_value_info("x", float_type, ["batch", 3, None]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("unshaped", float_type, None),
        ],
        [helper.make_tensor_value_info("out", float_type, None)],
        [
            numpy_helper.from_array(sample_array(TensorProto.FLOAT), "w"),
            helper.make_tensor("typed_i64", int_type, [3], [-1, 2**62, 0], raw=False),
            numpy_helper.from_array(np.array(3.5, np.float64), "scalar"),
            helper.make_tensor("typed_scalar", TensorProto.INT32, [], [-5], raw=False),
            numpy_helper.from_array(sample_array(TensorProto.STRING), "strings"),
        ],
        value_info=[
            helper.make_tensor_sequence_value_info("seq", float_type, [2]),
            helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [1, "n"]),
        ],
    )
    model = helper.make_model(
        graph,
        producer_name="mizuoto-tests",
        producer_version="1.2",
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("test.domain", 1)],
    )
    helper.set_model_props(model, {"author": "tests", "note": "\u00fc"})
    return model


@pytest.fixture(scope="module")
def feature_bytes() -> bytes:
    return feature_model().SerializeToString()


# --- tensors and graphs against onnx ---------------------------------------------------------


@pytest.mark.parametrize("raw", [True, False], ids=["raw_data", "typed_field"])
@pytest.mark.parametrize("code", ALL_CODES, ids=onnx_type_name)
def test_tensor_of_every_dtype_matches_onnx(tmp_path, code, raw):
    model = dtype_model(code, raw=raw and code != TensorProto.STRING)
    path = tmp_path / "dtypes.onnx"
    onnx.save_model(model, path)
    ours, theirs = load_onnx(path), onnx.load(path)
    assert [t.dims for t in ours.graph.initializers] == [(2, 3), (), (0, 3)]
    assert_same_model(ours, theirs)


@pytest.mark.parametrize(
    "code", [c for c in ALL_CODES if c != TensorProto.STRING], ids=onnx_type_name
)
def test_torch_gives_the_real_dtype_where_torch_has_it(code):
    torch = pytest.importorskip("torch")
    (tensor, _, _) = parse_onnx(dtype_model(code, raw=True).SerializeToString()).graph.initializers
    proto = numpy_helper.from_array(sample_array(code), "t0")
    values, bits = numpy_helper.to_array(proto), tensor.numpy()
    converted = tensor.torch()
    assert tuple(converted.shape) == tensor.dims
    if tensor.dtype.bit_pattern and tensor.dtype.torch_dtype:
        assert converted.dtype == getattr(torch, tensor.dtype.torch_dtype)
        as_float = converted.float().numpy()
        np.testing.assert_array_equal(as_float, values.astype(np.float32))
        assert (
            converted.view(torch.from_numpy(bits.copy()).dtype).numpy().tobytes() == bits.tobytes()
        )
    else:
        assert converted.numpy().tobytes() == bits.tobytes()
        assert converted.numpy().dtype == bits.dtype
    assert bits.dtype.itemsize * 8 >= tensor.dtype.bits


def test_bit_pattern_dtypes_say_so():
    model = parse_onnx(dtype_model(TensorProto.BFLOAT16, raw=True).SerializeToString())
    tensor = model.graph.initializers[0]
    assert tensor.dtype.bit_pattern and tensor.numpy().dtype == np.uint16
    string_model = parse_onnx(dtype_model(TensorProto.STRING, raw=False).SerializeToString())
    with pytest.raises(TypeError, match="strings"):
        string_model.graph.initializers[0].torch()


def test_nodes_attributes_and_subgraphs_match_onnx(tmp_path):
    path = tmp_path / "features.onnx"
    onnx.save_model(feature_model(), path)
    ours, theirs = load_onnx(path), onnx.load(path)
    assert_same_model(ours, theirs)
    kinds = {a.kind for node in ours.graph.nodes for a in node.attributes}
    assert kinds >= {"float", "int", "string", "tensor", "graph"}
    assert kinds >= {"floats", "ints", "strings", "tensors", "graphs"}
    assert ours.opset_version() == ours.opset_version("ai.onnx") == 18
    assert ours.graph.nodes[0].attribute("i").value == -7
    assert ours.graph.nodes[0].attribute("missing") is None


def test_tensors_include_constants_and_subgraphs_as_onnx_evaluates_them(feature_bytes):
    ours = list(parse_onnx(feature_bytes).tensors())
    expected = reference_tensors(onnx.load_model_from_string(feature_bytes).graph)
    assert [t.name for t in ours] == [name for name, _ in expected]
    assert {"c_value_float", "c_value_strings", "then_w", "then_c", "else_c", "deep"} <= {
        t.name for t in ours
    }
    for tensor, (name, proto) in zip(ours, expected, strict=True):
        assert_same_tensor(tensor, proto, name=name)


def test_external_data_matches_onnx(tmp_path):
    model = feature_model()
    arrays = {
        "big": np.arange(4096, dtype=np.float32).reshape(64, 64),
        "half": sample_array(TensorProto.FLOAT16),
        "bf16": sample_array(TensorProto.BFLOAT16),
        "nibbles": sample_array(TensorProto.UINT4, (3, 3)),
        "longs": sample_array(TensorProto.INT64),
    }
    model.graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in arrays.items())
    path = tmp_path / "model" / "external.onnx"
    path.parent.mkdir()
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    assert (path.parent / "weights.bin").stat().st_size > arrays["big"].nbytes
    ours = load_onnx(path)
    stored = onnx.load(path, load_external_data=False).graph.initializer
    external = [t.name for t in stored if t.data_location == TensorProto.EXTERNAL]
    assert set(arrays) <= set(external)
    assert [t.name for t in ours.graph.initializers if t.is_external] == external
    assert_same_model(ours, onnx.load(path))
    big = next(t for t in ours.graph.initializers if t.name == "big")
    assert not big.numpy().flags.writeable  # a view of the mapped file, not a copy
    np.testing.assert_array_equal(big.torch().numpy(), arrays["big"])


def _external_model(tmp_path, location: str) -> str:
    tensor = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        tensor.external_data.add(key=key, value=value)
    path = tmp_path / "model" / "m.onnx"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(
        helper.make_model(helper.make_graph([], "g", [], [], [tensor])).SerializeToString()
    )
    return path


@pytest.mark.parametrize(
    ("location", "problem"),
    [
        ("../outside.bin", "escapes"),
        ("sub/../../outside.bin", "escapes"),
        ("ABSOLUTE", "absolute"),
        ("missing.bin", "does not exist"),
        ("short.bin", "needs 16"),
    ],
)
def test_bad_external_data_is_rejected_clearly(tmp_path, location, problem):
    (tmp_path / "outside.bin").write_bytes(bytes(16))
    if location == "ABSOLUTE":
        location = str(tmp_path / "outside.bin")
    path = _external_model(tmp_path, location)
    (path.parent / "short.bin").write_bytes(bytes(8))
    with pytest.raises(OnnxFormatError, match=problem) as caught:
        load_onnx(path)
    assert "initializer[0]" in str(caught.value) and "'w'" in str(caught.value)


def test_external_data_in_memory_needs_a_directory(tmp_path):
    path = _external_model(tmp_path, "w.bin")
    (path.parent / "w.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    with pytest.raises(OnnxFormatError, match="directory="):
        parse_onnx(path.read_bytes())
    tensor = parse_onnx(path.read_bytes(), directory=path.parent).graph.initializers[0]
    np.testing.assert_array_equal(tensor.numpy(), np.arange(4, dtype=np.float32))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the legacy exporter warns
def test_a_torch_exported_model_matches_onnx(tmp_path):
    torch = pytest.importorskip("torch")

    class Small(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv1d(2, 4, 3, padding=1)
            self.norm = torch.nn.LayerNorm(4)
            self.linear = torch.nn.Linear(4, 3)

        def forward(self, x):
            y = self.conv(x).transpose(1, 2)
            return torch.nn.functional.gelu(self.linear(self.norm(y))) * 0.5 + y.mean()

    module = Small().eval()
    path = tmp_path / "small.onnx"
    try:
        torch.onnx.export(
            module,
            (torch.zeros(1, 2, 8),),
            str(path),
            dynamo=False,
            input_names=["x"],
            dynamic_axes={"x": {0: "batch", 2: "time"}},
        )
    except Exception as error:  # the exporter's own dependencies may be missing
        pytest.skip(f"torch.onnx.export is not possible here: {type(error).__name__}: {error}")
    ours, theirs = load_onnx(path), onnx.load(path)
    assert_same_model(ours, theirs)
    assert ours.graph.inputs[0].shape == ("batch", 2, "time")
    parameters = dict(module.state_dict())
    matched = [t for t in ours.tensors() if t.name in parameters]
    assert matched, [t.name for t in ours.tensors()]
    for tensor in matched:
        assert torch.equal(tensor.torch(), parameters[tensor.name])


# --- the wire format's corners, against onnx's protobuf parser -------------------------------


UNKNOWN_FIELDS = (
    field(900, 0, 2**64 - 1)
    + field(901, 1, bytes(8))
    + field(902, 2, b"\x0a\x03abc")
    + field(903, 5, bytes(4))
    + varint(904 << 3 | 3)
    + field(1, 0, 5)
    + varint(904 << 3 | 4)
)


def model_bytes(graph: bytes, extra: bytes = b"") -> bytes:
    return field(1, 0, 8) + field(7, 2, graph) + field(8, 2, field(2, 0, 18)) + extra


def assert_matches_protobuf(data: bytes) -> None:
    assert_same_model(parse_onnx(data), onnx.load_model_from_string(data))


def test_last_occurrence_of_a_singular_field_wins():
    node = field(4, 2, b"Relu") + field(3, 2, b"first") + field(4, 2, b"Sigmoid")
    extra = field(2, 2, b"one") + field(2, 2, b"two") + field(1, 0, 9)
    data = model_bytes(field(1, 2, node + field(3, 2, b"second")), extra)
    assert_matches_protobuf(data)
    model = parse_onnx(data)
    assert (model.producer_name, model.ir_version, model.graph.nodes[0].op_type) == (
        "two",
        9,
        "Sigmoid",
    )


def test_a_repeated_singular_message_is_merged_like_protobuf_does():
    first = field(2, 2, b"g") + field(1, 2, field(4, 2, b"Relu"))
    tensor = field(1, 0, 2) + field(2, 0, 1) + field(8, 2, b"w") + field(9, 2, bytes(8))
    second = field(5, 2, tensor) + field(1, 2, field(4, 2, b"Abs"))
    data = field(7, 2, first) + field(7, 2, second)
    assert_matches_protobuf(data)
    assert [n.op_type for n in parse_onnx(data).graph.nodes] == ["Relu", "Abs"]


def test_packed_and_unpacked_repeated_scalars_and_unknown_fields():
    floats = [1.5, -2.0, 3.25, 0.0]
    packed_floats = field(4, 2, np.array(floats[:2], "<f4").tobytes())
    unpacked_floats = b"".join(field(4, 5, np.float32(v).tobytes()) for v in floats[2:])
    dims = field(1, 2, varint(2) + varint(2))  # dims are declared unpacked; packed is accepted
    float_tensor = dims + field(2, 0, 1) + field(8, 2, b"f") + packed_floats + unpacked_floats
    longs = [-1, -(2**63), 2**62, 7]
    long_tensor = (
        field(1, 0, 4)
        + field(2, 0, 7)
        + field(8, 2, b"l")
        + field(7, 2, b"".join(varint(v) for v in longs[:2]))
        + b"".join(field(7, 0, v) for v in longs[2:])
        + UNKNOWN_FIELDS
    )
    ints = field(8, 2, varint(3) + varint(-4)) + field(8, 0, -(2**40))
    attribute = field(1, 2, b"axes") + field(20, 0, 7) + ints + UNKNOWN_FIELDS
    node = field(4, 2, b"Squeeze") + field(5, 2, attribute) + UNKNOWN_FIELDS
    graph = field(1, 2, node) + field(5, 2, float_tensor) + field(5, 2, long_tensor)
    data = model_bytes(graph + UNKNOWN_FIELDS, UNKNOWN_FIELDS)
    assert_matches_protobuf(data)
    model = parse_onnx(data)
    assert model.graph.nodes[0].attributes[0].value == (3, -4, -(2**40))
    np.testing.assert_array_equal(model.graph.initializers[0].numpy(), np.reshape(floats, (2, 2)))
    assert model.graph.initializers[1].numpy().tolist() == longs


def test_an_attribute_without_a_type_is_inferred_from_its_value():
    attribute = field(1, 2, b"alpha") + field(2, 5, np.float32(0.5).tobytes())
    data = model_bytes(field(1, 2, field(4, 2, b"Elu") + field(5, 2, attribute)))
    (value,) = parse_onnx(data).graph.nodes[0].attributes
    assert (value.kind, value.value) == ("float", 0.5)


# --- corrupt input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (field(7, 2, b"")[:-1] + varint(2**62), "field 7"),
        (field(7, 2, field(5, 2, field(9, 2, bytes(4)))[:-2]), "GraphProto"),
        (bytes([0x08]) + b"\xff" * 11, "varint longer than 10 bytes"),
        (model_bytes(field(5, 2, field(1, 0, 2**40) * 2 + field(2, 0, 1))), "more elements"),
        (model_bytes(field(5, 2, field(1, 0, -3) + field(2, 0, 1))), "negative dimension"),
        (model_bytes(field(5, 2, field(2, 0, 99))), "data type 99"),
        (model_bytes(field(1, 2, field(4, 0, 5))), "wire type varint, expected length"),
        (model_bytes(field(1, 2, field(3, 2, b"\xff\xfe"))), "not UTF-8"),
        (field(1, 0, 8), "no graph"),
        (b"", "no graph"),
    ],
    ids=[
        "huge-length",
        "cut-message",
        "long-varint",
        "huge-dims",
        "negative-dim",
        "unknown-dtype",
        "wrong-wire-type",
        "bad-utf8",
        "no-graph",
        "empty",
    ],
)
def test_corrupt_input_raises_format_error_saying_where(data, where):
    start = time.process_time()  # CPU time: a busy machine cannot stretch it past the bound
    with pytest.raises(OnnxFormatError, match=where) as caught:
        parse_onnx(data)
    assert time.process_time() - start < 1
    assert isinstance(caught.value, ValueError)
    message = str(caught.value)
    assert "model" in message and ("byte" in message or "tensor" in message or "graph" in message)


def nested_if_model(depth: int) -> bytes:
    """Built by hand: protobuf itself refuses to build or parse messages nested this deep."""
    graph = field(2, 2, b"leaf")
    for _ in range(depth):
        attribute = field(1, 2, b"then_branch") + field(20, 0, 5) + field(6, 2, graph)
        graph = field(1, 2, field(4, 2, b"If") + field(5, 2, attribute))
    return model_bytes(graph)


def test_subgraph_nesting_is_bounded():
    parse_onnx(nested_if_model(MAX_GRAPH_DEPTH))
    with pytest.raises(OnnxFormatError, match="deeper than"):
        parse_onnx(nested_if_model(MAX_GRAPH_DEPTH + 1))


def check_parse_or_format_error(data: bytes) -> None:
    """Only a successful parse (whose tensors all decode) or an OnnxFormatError may come out."""
    start = time.process_time()  # CPU time, as above
    with contextlib.suppress(OnnxFormatError):
        json.dumps(describe(parse_onnx(data)), allow_nan=False)
    assert time.process_time() - start < 2


FUZZ = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@FUZZ
@given(data=st.data())
def test_truncated_prefixes_fail_cleanly(feature_bytes, data):
    cut = data.draw(st.integers(0, len(feature_bytes) - 1))
    check_parse_or_format_error(feature_bytes[:cut])


@FUZZ
@given(data=st.data())
def test_mutated_bytes_fail_cleanly(feature_bytes, data):
    positions = st.integers(0, len(feature_bytes) - 1)
    edits = data.draw(st.lists(st.tuples(positions, st.integers(0, 255)), min_size=1, max_size=8))
    mutated = bytearray(feature_bytes)
    for position, value in edits:
        mutated[position] = value
    check_parse_or_format_error(bytes(mutated))


@FUZZ
@given(data=st.data())
def test_inserted_and_deleted_bytes_fail_cleanly(feature_bytes, data):
    position = data.draw(st.integers(0, len(feature_bytes)))
    removed = data.draw(st.integers(0, 16))
    inserted = data.draw(st.binary(max_size=12))
    check_parse_or_format_error(
        feature_bytes[:position] + inserted + feature_bytes[position + removed :]
    )


# --- the command line ------------------------------------------------------------------------


def expected_json(value, kind: str):
    if kind in ("tensor", "graph"):
        return expected_json([value], kind + "s")[0]
    if kind == "tensors":
        return [
            {
                "dtype": onnx_type_name(t.data_type),
                "shape": list(t.dims),
                "sha256": reference_sha256(reference_array(t)),
            }
            for t in value
        ]
    if kind == "graphs":
        return [expected_graph_json(g) for g in value]
    if kind == "string":
        return value.decode("utf-8", "backslashreplace")
    if kind == "strings":
        return [item.decode("utf-8", "backslashreplace") for item in value]
    return list(value) if kind in ("floats", "ints") else value


def expected_value_json(info) -> dict:
    tensor_type = info.type.tensor_type
    dims = [
        getattr(d, d.WhichOneof("value")) if d.WhichOneof("value") else None
        for d in tensor_type.shape.dim
    ]
    return {
        "name": info.name,
        "kind": (info.type.WhichOneof("value") or "").removesuffix("_type"),
        "dtype": onnx_type_name(tensor_type.elem_type) if tensor_type.elem_type else None,
        "shape": dims if tensor_type.HasField("shape") else None,
    }


def expected_graph_json(graph) -> dict:
    nodes = []
    for node in graph.node:
        attributes = []
        for attribute in node.attribute:
            kind = AttributeProto.AttributeType.Name(attribute.type).lower()
            value = expected_json(helper.get_attribute_value(attribute), kind)
            attributes.append({"name": attribute.name, "type": kind, "value": value})
        nodes.append(
            {
                "name": node.name,
                "op_type": node.op_type,
                "domain": node.domain,
                "inputs": list(node.input),
                "outputs": list(node.output),
                "attributes": attributes,
            }
        )
    return {
        "name": graph.name,
        "inputs": [expected_value_json(i) for i in graph.input],
        "outputs": [expected_value_json(o) for o in graph.output],
        "nodes": nodes,
    }


def run_cli(*arguments: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mizuoto_runtime.convert.onnx", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_cli_json_matches_onnx(tmp_path, feature_bytes):
    path = tmp_path / "features.onnx"
    path.write_bytes(feature_bytes)
    done = run_cli(str(path), "--json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    proto = onnx.load(path)
    expected = {
        "ir_version": proto.ir_version,
        "producer_name": proto.producer_name,
        "producer_version": proto.producer_version,
        "opset_imports": [{"domain": o.domain, "version": o.version} for o in proto.opset_import],
        **expected_graph_json(proto.graph),
        "tensors": [
            {"name": name, **expected_json(tensor, "tensor")}
            for name, tensor in reference_tensors(proto.graph)
        ],
    }
    assert printed == expected


def test_cli_imports_neither_onnx_nor_torch(tmp_path, feature_bytes):
    path = tmp_path / "features.onnx"
    path.write_bytes(feature_bytes)
    script = (
        "import contextlib, io, sys\n"
        "from mizuoto_runtime.convert.onnx import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main([{str(path)!r}, '--json']) == 0\n"
        "print(sorted(m for m in ('onnx', 'torch', 'google.protobuf') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("case", ["missing", "truncated", "garbage", "directory"])
def test_cli_exits_2_with_one_line_for_a_bad_file(tmp_path, feature_bytes, case):
    path = tmp_path / "bad.onnx"
    if case == "truncated":
        path.write_bytes(feature_bytes[: len(feature_bytes) // 2])
    elif case == "garbage":
        path.write_bytes(b"\xff" * 64)
    elif case == "directory":
        path.mkdir()
    done = run_cli(str(path), "--json")
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert str(path) in done.stderr
