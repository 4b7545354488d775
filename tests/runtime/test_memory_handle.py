"""ModelHandle and units: what a handle counts, which blocks it streams, where its parts are."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mizuoto_runtime import ops
from mizuoto_runtime.lm import QwenConfig, QwenDecoder
from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.memory.units import discover_units
from mizuoto_runtime.ops import init_random


def decoder(layers: int = 3, tied: bool = False) -> QwenDecoder:
    config = QwenConfig.from_dict(
        {
            "model_type": "qwen3",
            "vocab_size": 101,
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "tie_word_embeddings": tied,
        }
    )
    model = QwenDecoder(config)
    init_random(model, torch.Generator().manual_seed(0))
    return model


def distinct_bytes(module: nn.Module) -> int:
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return sum(t.nbytes for t in tensors.values())


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_decoder_on_its_load_device_is_fully_resident_and_streams_by_layer(tied: bool):
    model = decoder(tied=tied)
    handle = ModelHandle(model, name="tiny:decoder", load_device="cpu", kind="sequence")
    assert handle.module is model
    assert handle.units == tuple(model.model.layers)
    assert handle.size_bytes == distinct_bytes(model)  # a tied table is counted once
    assert handle.resident_bytes == handle.size_bytes
    assert handle.streamed_bytes == handle.host_bytes == 0
    assert [part.nbytes for part in handle.unit_parts] == [
        distinct_bytes(model.model.layers[0])
    ] * 3


def test_a_module_on_the_offload_device_starts_in_host_memory():
    handle = ModelHandle(decoder(), name="tiny:decoder", load_device="meta")
    assert handle.resident_bytes == 0
    assert handle.host_bytes == handle.size_bytes
    assert handle.load_device == "meta" and handle.offload_device == "cpu"


def test_whole_units_may_start_elsewhere_but_a_unit_split_across_devices_is_rejected():
    model = decoder()
    model.model.layers[1].to("meta")
    handle = ModelHandle(model, name="tiny:decoder", load_device="cpu")
    assert handle.host_bytes == handle.unit_parts[1].nbytes
    model.model.layers[2].mlp.to("meta")
    with pytest.raises(ValueError, match="tiny:decoder"):
        ModelHandle(model, name="tiny:decoder", load_device="cpu")


def test_engine_chosen_units_override_discovery_and_empty_units_make_one_part():
    model = decoder()
    mlps = [layer.mlp for layer in model.model.layers]
    handle = ModelHandle(model, name="tiny:decoder", load_device="cpu", units=mlps)
    assert handle.units == tuple(mlps)
    assert handle.base.nbytes == handle.size_bytes - 3 * distinct_bytes(mlps[0])
    whole = ModelHandle(model, name="tiny:decoder", load_device="cpu", units=())
    assert whole.units == () and whole.base.nbytes == whole.size_bytes


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [("name", {"name": ""}), ("kind", {"name": "x", "kind": "stream"})],
)
def test_bad_handle_arguments_name_the_field(field: str, kwargs: dict[str, object]):
    with pytest.raises(ValueError, match=field):
        ModelHandle(ops.default.Linear(2, 2), load_device="cpu", **kwargs)  # type: ignore[arg-type]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = ops.default.Linear(4, 4)
        self.act = nn.GELU()


class Codec(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(Block(), Block(), Block())
        self.mixed = nn.Sequential(ops.default.Linear(4, 4), nn.ReLU(), ops.default.Linear(4, 4))
        self.activations = nn.ModuleList([nn.ReLU(), nn.ReLU()])
        self.decoder = nn.ModuleList([Block(), Block()])
        self.head = ops.default.Linear(4, 2)


def test_discovery_takes_every_repeated_weighted_block_and_nothing_else():
    codec = Codec()
    assert discover_units(codec) == [*codec.encoder, *codec.decoder]


def test_a_weight_shared_by_two_units_stays_in_the_base():
    codec = Codec()
    codec.decoder[1].proj.weight = codec.decoder[0].proj.weight
    handle = ModelHandle(codec, name="codec", load_device="cpu")
    shared = codec.decoder[0].proj.weight
    assert any(t is shared for t in handle.base.tensors)
    assert all(t is not shared for part in handle.unit_parts for t in part.tensors)
    assert handle.size_bytes == distinct_bytes(codec)
