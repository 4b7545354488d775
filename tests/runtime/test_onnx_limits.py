"""The ONNX reader at its limits: shapes numpy cannot hold, files built to exhaust memory,
external data through links, and cancel. Models are built by hand, so onnx is not needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from small_models import field, varint

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.convert._wire import MEMORY_FACTOR, MEMORY_FLOOR
from mizuoto_runtime.convert.onnx import OnnxFormatError, load_onnx, parse_onnx
from mizuoto_sdk import OperationTimeoutError


def model(graph: bytes) -> bytes:
    return field(1, 0, 8) + field(7, 2, graph)


def initializer(dims: list[int], raw: bytes = b"", dtype: int = 1, packed: bool = False) -> bytes:
    if packed:
        shape = field(1, 2, b"".join(varint(d) for d in dims))
    else:
        shape = b"".join(field(1, 0, d) for d in dims)
    tensor = shape + field(2, 0, dtype) + field(8, 2, b"w") + field(9, 2, raw)
    return model(field(5, 2, tensor))


@pytest.mark.parametrize("count", [65, 100, 10_000])
@pytest.mark.parametrize("packed", [False, True])
def test_more_dimensions_than_numpy_holds_is_a_format_error(count, packed):
    with pytest.raises(
        OnnxFormatError, match=f"{count} dimensions; numpy and torch hold at most 64"
    ):
        parse_onnx(initializer([1] * count, bytes(4), packed=packed))


def test_sixty_four_dimensions_read_in_numpy_and_torch():
    (tensor,) = parse_onnx(initializer([1] * 63 + [2], bytes(8))).tensors()
    assert tensor.numpy().shape == (1,) * 63 + (2,)
    assert tensor.torch().dim() == 64


@pytest.mark.parametrize(
    "dims",
    [[0, 2**62, 2**62], [2**62, 0, 16], [0, 2**63 - 1, 2], [2**40, 2**40], [0, 2**61, 8]],
)
@pytest.mark.parametrize("dtype", [1, 8, 11, 21])  # float32, string, float64, uint4
def test_shapes_numpy_cannot_index_are_format_errors(dims, dtype):
    with pytest.raises(OnnxFormatError, match=r"more elements than numpy can index|raw_data"):
        parse_onnx(initializer(dims, dtype=dtype))


@pytest.mark.parametrize("dims", [[0, 2**40], [2**50, 0], [0, 2**62 // 4]])
def test_empty_tensors_of_huge_but_indexable_shape_read(dims):
    (tensor,) = parse_onnx(initializer(dims)).tensors()
    assert tensor.numpy().shape == tuple(dims) and tensor.torch().shape == tuple(dims)


def run_cli(path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mizuoto_runtime.convert.onnx", str(path), "--json"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    "data", [initializer([1] * 65, bytes(4)), initializer([0, 2**62, 2**62])], ids=["65", "huge"]
)
def test_cli_json_reports_such_tensors_in_one_line(tmp_path, data):
    path = tmp_path / "bad.onnx"
    path.write_bytes(data)
    done = run_cli(path)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    ok = tmp_path / "ok.onnx"
    ok.write_bytes(initializer([0, 2**40]))
    done = run_cli(ok)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tensors"][0]["shape"] == [0, 2**40]


_MEASURE = """
import resource, sys
from mizuoto_runtime.convert.onnx import OnnxFormatError, load_onnx
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    load_onnx(sys.argv[1])
    outcome = "parsed"
except OnnxFormatError as error:
    outcome = str(error)
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
print(grown, outcome)
"""


def _shape_of(dims: bytes) -> bytes:
    """A graph with one input whose tensor shape holds ``dims``."""
    return field(11, 2, field(2, 2, field(1, 2, field(2, 2, dims))))


FLOODS = {  # a graph of about 4 MB, made of the smallest records of one kind
    "nodes": lambda n: field(1, 2, b"") * n,
    "attributes": lambda n: field(1, 2, field(5, 2, b"") * n),
    "dimensions": lambda n: _shape_of(field(1, 2, b"") * n),
    "names": lambda n: field(1, 2, field(1, 2, b"") * n),
}


@pytest.mark.parametrize("kind", sorted(FLOODS))
def test_a_file_built_to_exhaust_memory_is_refused_within_the_bound(tmp_path, kind):
    path = tmp_path / "flood.onnx"
    path.write_bytes(model(FLOODS[kind](2_000_000)))
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    grown, outcome = done.stdout.split(" ", 1)
    size = path.stat().st_size
    assert "memory" in outcome and f"{MEMORY_FACTOR} x the file's size" in outcome
    assert int(grown) <= MEMORY_FACTOR * size + MEMORY_FLOOR


def test_a_small_graph_of_many_real_nodes_parses(tmp_path):
    node = field(1, 2, b"input_0") + field(2, 2, b"output_0") + field(4, 2, b"Relu")
    data = model(field(1, 2, node) * 20_000 + field(2, 2, b"g"))
    assert len(parse_onnx(data).graph.nodes) == 20_000


def test_parsing_stops_when_the_bound_call_times_out():
    data = model(field(1, 2, field(4, 2, b"Relu")) * 50_000)
    ctx = RequestContext(seed=0)
    with ctx.bind():
        assert len(parse_onnx(data).graph.nodes) == 50_000
        ctx.cancel("timeout")
        with pytest.raises(OperationTimeoutError):
            parse_onnx(data)


def _external_model(folder, location: str) -> None:
    pairs = b"".join(
        field(13, 2, field(1, 2, key.encode()) + field(2, 2, value.encode()))
        for key, value in (("location", location), ("offset", "0"), ("length", "16"))
    )
    tensor = field(1, 0, 4) + field(2, 0, 1) + field(8, 2, b"w") + pairs + field(14, 0, 1)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "m.onnx").write_bytes(model(field(5, 2, tensor)))


def test_external_data_through_a_hugging_face_cache_snapshot_reads(tmp_path):
    entry = tmp_path / "hub" / "models--org--name"
    snapshot = entry / "snapshots" / "abc123"
    (entry / "blobs").mkdir(parents=True)
    (entry / "blobs" / "f00d").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    _external_model(snapshot, "weights.bin")
    (snapshot / "weights.bin").symlink_to(os.path.join("..", "..", "blobs", "f00d"))
    (tensor,) = load_onnx(snapshot / "m.onnx").tensors()
    assert tensor.numpy().tolist() == [0, 1, 2, 3]


def test_external_data_linking_into_another_cache_entry_is_refused(tmp_path):
    other = tmp_path / "hub" / "models--org--other" / "blobs"
    other.mkdir(parents=True)
    (other / "f00d").write_bytes(bytes(16))
    snapshot = tmp_path / "hub" / "models--org--name" / "snapshots" / "abc123"
    _external_model(snapshot, "weights.bin")
    (snapshot / "weights.bin").symlink_to(other / "f00d")
    with pytest.raises(OnnxFormatError, match="escapes the model's directory"):
        load_onnx(snapshot / "m.onnx")
