"""load_state_dict on hostile files: typed errors for any content, no code run, no link out."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import safetensors.torch
import torch

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.weights.loading import CheckpointError, load_state_dict
from mizuoto_sdk import CancelledError


def _weights(value: float = 1.0) -> dict[str, torch.Tensor]:
    return {"a": torch.full((2,), value), "b": torch.arange(3)}


def _sharded(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file({"a": torch.ones(2)}, folder / "model-1.safetensors")
    safetensors.torch.save_file({"b": torch.arange(3)}, folder / "model-2.safetensors")
    index = {"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


@pytest.mark.parametrize("depth", [10_000, 200_000])
def test_a_deeply_nested_index_is_a_checkpoint_error(tmp_path: Path, depth: int):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"weight_map": ' + "[" * depth + "]" * depth + "}")
    with pytest.raises(CheckpointError, match=r"index\.json: not a readable index JSON") as info:
        load_state_dict(tmp_path)
    assert info.value.path == index


@pytest.mark.parametrize(
    "content",
    [
        b"hello world, this is text\n",
        b"{}",
        b"e",
        b"K\x01.",
        b"(lp0\nI1\naI2\na.",  # a protocol-0 pickle of a list, not a mapping of tensors
        bytes(range(256)) * 3,
        b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01K\x01s.",  # {"a": 1}
    ],
)
@pytest.mark.parametrize("suffix", [".bin", ".pt", ".ckpt"])
def test_a_pickle_file_holding_anything_else_is_a_checkpoint_error(tmp_path, content, suffix):
    path = tmp_path / f"w{suffix}"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        load_state_dict(path)
    assert info.value.path == path and str(info.value).startswith(f"{path}: ")
    assert "weights_only" not in str(info.value)


class _Runs:
    """Pickles as a call to os.system: loading it unsafely would run a command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("how", ["torch.save", "pickle-2", "pickle-4"])
def test_a_pickle_that_holds_code_is_refused_without_unsafe_advice(tmp_path, how):
    path, marker = tmp_path / "evil.pt", tmp_path / "ran"
    payload = {"weight": torch.ones(2), "x": _Runs(marker)}
    if how == "torch.save":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps({"x": _Runs(marker)}, protocol=int(how[-1])))
    with pytest.raises(CheckpointError) as info:
        load_state_dict(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert "weights_only" not in message and "trust" not in message
    assert info.value.__cause__ is None  # torch's advice is not chained on either
    if how != "pickle-4":  # protocol 4 fails on its framing before any global is read
        assert "refused: the file holds code" in message and "system" in message
    assert not marker.exists()


def test_an_index_shard_that_links_outside_the_folder_is_refused(tmp_path: Path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    safetensors.torch.save_file({"b": torch.arange(3)}, elsewhere / "secret.safetensors")
    model = _sharded(tmp_path / "model")
    (model / "model-2.safetensors").unlink()
    (model / "model-2.safetensors").symlink_to(elsewhere / "secret.safetensors")
    with pytest.raises(CheckpointError, match=r"index\.json: names shards that link outside"):
        load_state_dict(model)


def test_a_folder_whose_checkpoint_links_outside_it_is_refused(tmp_path: Path):
    safetensors.torch.save_file(_weights(), tmp_path / "secret.safetensors")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").symlink_to(tmp_path / "secret.safetensors")
    with pytest.raises(CheckpointError, match="outside the model's folder") as info:
        load_state_dict(tmp_path / "model")
    assert info.value.path == tmp_path / "model" / "model.safetensors"
    # the file itself, named by the caller, is the caller's choice
    assert torch.equal(load_state_dict(tmp_path / "secret.safetensors")["a"], torch.ones(2))


def test_links_inside_the_folder_and_a_linked_folder_load(tmp_path: Path):
    real = _sharded(tmp_path / "real")
    (real / "sub").mkdir()
    (real / "model-1.safetensors").rename(real / "sub" / "one.safetensors")
    (real / "model-1.safetensors").symlink_to("sub/one.safetensors")
    (tmp_path / "alias").symlink_to(real, target_is_directory=True)
    assert torch.equal(load_state_dict(tmp_path / "alias")["b"], torch.arange(3))


def _hf_entry(cache: Path, name: str, files: dict[str, bytes]) -> Path:
    """A Hugging Face cache entry: blobs by hash, a snapshot linking each file to them."""
    entry = cache / f"models--org--{name}"
    snapshot = entry / "snapshots" / "0123abcd"
    (entry / "blobs").mkdir(parents=True)
    for file_name, data in files.items():
        blob = entry / "blobs" / f"{abs(hash(file_name + name)):x}"
        blob.write_bytes(data)
        link = snapshot / file_name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


def test_a_hugging_face_cache_snapshot_loads_through_its_blob_links(tmp_path: Path):
    shards = _sharded(tmp_path / "src")
    files = {p.name: p.read_bytes() for p in shards.iterdir()}
    snapshot = _hf_entry(tmp_path / "hub", "sharded", files)
    assert torch.equal(load_state_dict(snapshot)["a"], torch.ones(2))
    single = _hf_entry(
        tmp_path / "hub",
        "single",
        {"model.safetensors": (shards / "model-2.safetensors").read_bytes()},
    )
    assert torch.equal(load_state_dict(single)["b"], torch.arange(3))


def test_a_cache_snapshot_linking_into_another_entry_is_refused(tmp_path: Path):
    shards = _sharded(tmp_path / "src")
    other = _hf_entry(
        tmp_path / "hub",
        "other",
        {"model-2.safetensors": (shards / "model-2.safetensors").read_bytes()},
    )
    files = {p.name: p.read_bytes() for p in shards.iterdir() if p.name != "model-2.safetensors"}
    snapshot = _hf_entry(tmp_path / "hub", "victim", files)
    (snapshot / "model-2.safetensors").symlink_to(
        os.path.relpath((other / "model-2.safetensors").resolve(), snapshot)
    )
    with pytest.raises(CheckpointError, match=r"names shards that link outside.*model-2"):
        load_state_dict(snapshot)


def test_reading_stops_when_the_bound_call_is_cancelled(tmp_path: Path):
    model = _sharded(tmp_path / "model")
    ctx = RequestContext(seed=0)
    with ctx.bind():
        assert torch.equal(load_state_dict(model)["a"], torch.ones(2))
        ctx.cancel()
        with pytest.raises(CancelledError):
            load_state_dict(model)
