"""load_state_dict, key helpers, fold_weight_norm and load_into, against torch and safetensors."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import safetensors.torch
import torch
from torch import nn

from mizuoto_runtime import ops
from mizuoto_runtime.weights.loading import (
    CheckpointError,
    LoadError,
    fold_weight_norm,
    load_into,
    load_state_dict,
    replace_prefixes,
    strip_prefix,
)


def tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(11, 4, generator=g),
        "layers.0.proj.weight": torch.randn(4, 4, generator=g).to(torch.bfloat16),
        "layers.0.proj.bias": torch.randn(4, generator=g),
        "steps": torch.arange(3),
    }


def assert_same_tensors(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(found) == sorted(expected)
    for key, value in expected.items():
        assert found[key].dtype == value.dtype, key
        assert torch.equal(found[key], value), key


class Net(nn.Module):
    def __init__(self, layers=ops.default, device=None) -> None:
        super().__init__()
        self.embed = layers.Embedding(11, 4, device=device)
        self.proj = layers.Linear(4, 4, device=device)
        self.norm = layers.LayerNorm(4, device=device)
        self.register_buffer("scale", torch.ones(4, device=device))
        self.register_buffer("cache", torch.zeros(2, device=device), persistent=False)


def net_state(seed: int = 0) -> dict[str, torch.Tensor]:
    reference = ops.init_random(Net(nn), torch.Generator().manual_seed(seed))
    reference.scale.mul_(seed + 2)
    return {k: v.clone() for k, v in reference.state_dict().items()}


# -- load_state_dict -------------------------------------------------------------------------


def test_single_safetensors_file(tmp_path: Path):
    safetensors.torch.save_file(tensors(), tmp_path / "w.safetensors")
    assert_same_tensors(load_state_dict(tmp_path / "w.safetensors"), tensors())


def test_folder_with_a_single_model_safetensors(tmp_path: Path):
    safetensors.torch.save_file(tensors(), tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text("{}")
    assert_same_tensors(load_state_dict(tmp_path), tensors())


def test_sharded_folder_written_by_hand(tmp_path: Path):
    whole = tensors()
    shards = {"model-00001-of-00002.safetensors": ["embed.weight", "steps"]}
    shards["model-00002-of-00002.safetensors"] = ["layers.0.proj.weight", "layers.0.proj.bias"]
    weight_map = {}
    for shard, keys in shards.items():
        safetensors.torch.save_file({k: whole[k] for k in keys}, tmp_path / shard)
        weight_map.update(dict.fromkeys(keys, shard))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = load_state_dict(tmp_path)
    assert list(loaded) == list(weight_map)
    assert_same_tensors(loaded, whole)


def test_sharded_folder_written_by_transformers_loads_into_a_fresh_model(tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp_path, max_shard_size="20KB", safe_serialization=True)
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    loaded = load_state_dict(tmp_path)
    expected = model.state_dict()
    for key, value in loaded.items():
        assert torch.equal(value, expected[key]), key
    # transformers leaves the tied lm_head out; load_into fills it from the embedding it ties to.
    assert "lm_head.weight" not in loaded
    with torch.device("meta"):
        fresh = transformers.LlamaForCausalLM(config)
    load_into(fresh, loaded)
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight
    tokens = torch.tensor([[1, 5, 9, 3]])
    fresh.model.rotary_emb.inv_freq = model.model.rotary_emb.inv_freq
    with torch.no_grad():
        assert torch.equal(fresh(tokens).logits, model(tokens).logits)


def test_pickle_checkpoint_is_read_memory_mapped(tmp_path: Path):
    torch.save(tensors(), tmp_path / "w.pt")
    loaded = load_state_dict(tmp_path / "w.pt")
    assert_same_tensors(loaded, tensors())
    module = ops.default.Linear(4, 4, bias=False, dtype=torch.bfloat16)
    load_into(module, {"weight": loaded["layers.0.proj.weight"]})
    assert module.weight.data_ptr() == loaded["layers.0.proj.weight"].data_ptr()


def test_legacy_pickle_format_is_read_without_mmap(tmp_path: Path):
    torch.save(tensors(), tmp_path / "w.pth", _use_new_zipfile_serialization=False)
    assert_same_tensors(load_state_dict(tmp_path / "w.pth"), tensors())


def test_nested_pickle_needs_member(tmp_path: Path):
    torch.save({"generator": tensors(), "epoch": 3}, tmp_path / "g.pt")
    with pytest.raises(
        CheckpointError, match=r"'generator' \(dict\).*member= one of \['generator'\]"
    ):
        load_state_dict(tmp_path / "g.pt")
    assert_same_tensors(load_state_dict(tmp_path / "g.pt", member="generator"), tensors())
    with pytest.raises(CheckpointError, match="no member 'model'"):
        load_state_dict(tmp_path / "g.pt", member="model")


class NotATensor:
    pass


def test_pickle_with_a_python_object_is_refused(tmp_path: Path):
    torch.save({"weight": torch.ones(2), "extra": NotATensor()}, tmp_path / "evil.bin")
    with pytest.raises(CheckpointError, match=r"evil\.bin: refused: the file holds code") as info:
        load_state_dict(tmp_path / "evil.bin")
    assert "NotATensor" in str(info.value) and "weights_only" not in str(info.value)


def test_missing_file_names_the_path(tmp_path: Path):
    with pytest.raises(CheckpointError, match=r"nope\.safetensors: no such file") as info:
        load_state_dict(tmp_path / "nope.safetensors")
    assert info.value.path == tmp_path / "nope.safetensors"
    assert isinstance(info.value, ValueError)


def test_index_naming_a_missing_shard(tmp_path: Path):
    safetensors.torch.save_file({"a": torch.ones(1)}, tmp_path / "model-1.safetensors")
    index = {"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        CheckpointError, match=r"index\.json: names shards that do not exist.*model-2"
    ):
        load_state_dict(tmp_path)


def test_index_placing_a_key_in_the_wrong_shard(tmp_path: Path):
    safetensors.torch.save_file({"a": torch.ones(1)}, tmp_path / "model-1.safetensors")
    index = {"weight_map": {"a": "model-1.safetensors", "b": "model-1.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"model-1\.safetensors: the index places b"):
        load_state_dict(tmp_path)


def test_index_that_is_not_an_index(tmp_path: Path):
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(CheckpointError, match="weight_map"):
        load_state_dict(tmp_path)


@pytest.mark.parametrize("name", ["w.safetensors", "w.pt", "w.bin"])
def test_corrupt_file(tmp_path: Path, name: str):
    (tmp_path / name).write_bytes(b"\x00garbage, not a checkpoint" * 4)
    with pytest.raises(CheckpointError, match=rf"{name}: not a readable"):
        load_state_dict(tmp_path / name)


def test_truncated_torch_zip(tmp_path: Path):
    torch.save(tensors(), tmp_path / "w.pt")
    data = (tmp_path / "w.pt").read_bytes()
    (tmp_path / "w.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"w\.pt: not a readable torch checkpoint"):
        load_state_dict(tmp_path / "w.pt")


def test_unknown_format(tmp_path: Path):
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07")
    with pytest.raises(CheckpointError, match=r"model\.onnx: unknown checkpoint format '\.onnx'"):
        load_state_dict(tmp_path / "model.onnx")


def test_folder_without_a_checkpoint_says_what_it_holds(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"no checkpoint found.*config\.json"):
        load_state_dict(tmp_path)


def test_folder_with_unindexed_shards_is_ambiguous(tmp_path: Path):
    for name in ("a.safetensors", "b.safetensors"):
        safetensors.torch.save_file({"x": torch.ones(1)}, tmp_path / name)
    with pytest.raises(CheckpointError, match=r"ambiguous.*a\.safetensors, b\.safetensors"):
        load_state_dict(tmp_path)


# -- key helpers -----------------------------------------------------------------------------


def test_strip_prefix_selects_and_strips():
    sd = {"generator.conv.weight": torch.ones(1), "discriminator.x": torch.ones(1)}
    assert list(strip_prefix(sd, "generator.")) == ["conv.weight"]
    assert strip_prefix(sd, "generator.")["conv.weight"] is sd["generator.conv.weight"]
    with pytest.raises(ValueError, match=r"no key starts with 'model\.'.*discriminator\."):
        strip_prefix(sd, "model.")


def test_replace_prefixes_longest_match_wins_and_others_are_kept():
    sd = {"enc.block.0.w": torch.ones(1), "enc.norm": torch.ones(1), "head": torch.ones(1)}
    out = replace_prefixes(sd, {"enc.": "encoder.", "enc.block.": "encoder.layers."})
    assert list(out) == ["encoder.layers.0.w", "encoder.norm", "head"]
    assert list(replace_prefixes(sd, {"": "model."})) == ["model." + k for k in sd]


def test_replace_prefixes_refuses_collisions():
    sd = {"a.w": torch.ones(1), "b.w": torch.ones(1)}
    with pytest.raises(ValueError, match=r"both 'a\.w' and 'b\.w' to 'c\.w'"):
        replace_prefixes(sd, {"a.": "c.", "b.": "c."})


# -- fold_weight_norm ------------------------------------------------------------------------

WEIGHT_NORMED = [
    (lambda: nn.Conv1d(5, 6, 3), (2, 5, 9), 0),
    (lambda: nn.Conv1d(5, 6, 3), (2, 5, 9), 1),
    (lambda: nn.Conv1d(5, 6, 3), (2, 5, 9), 2),
    (lambda: nn.Conv1d(5, 6, 3), (2, 5, 9), None),
    (lambda: nn.Conv1d(1, 6, 1), (2, 1, 9), 0),
    (lambda: nn.ConvTranspose1d(6, 4, 4, stride=2), (2, 6, 9), 0),
    (lambda: nn.Linear(7, 3), (4, 7), 0),
    (lambda: nn.Linear(7, 3), (4, 7), 1),
    (lambda: nn.Linear(7, 3), (4, 7), None),
]


@pytest.mark.parametrize(("make", "shape", "dim"), WEIGHT_NORMED)
@pytest.mark.parametrize("api", ["weight_norm", "parametrizations"])
def test_fold_weight_norm_equals_torch(make, shape, dim, api):
    normed = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if api == "weight_norm":
            nn.utils.weight_norm(normed, dim=dim)
        else:
            nn.utils.parametrizations.weight_norm(normed, dim=dim)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # g away from its initial ||v||, so a wrong fold shows
        for name, tensor in normed.state_dict().items():
            if name.endswith(("weight_g", "original0")):
                tensor.uniform_(0.5, 2.0, generator=g)
    folded = fold_weight_norm(normed.state_dict())
    plain = make()
    assert sorted(folded) == sorted(plain.state_dict())
    load_into(plain, folded)
    x = torch.randn(shape, generator=g)
    with torch.no_grad():
        expected = normed(x)  # the old API recomputes .weight in a pre-forward hook
        torch.testing.assert_close(plain.weight, normed.weight, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(plain(x), expected, rtol=1e-6, atol=1e-6)


def test_fold_weight_norm_keeps_other_keys_and_order():
    sd = {"a.bias": torch.ones(2), "a.weight_v": torch.ones(2, 3), "a.weight_g": torch.ones(2, 1)}
    sd["b"] = torch.zeros(1)
    folded = fold_weight_norm(sd)
    assert list(folded) == ["a.bias", "a.weight", "b"]
    torch.testing.assert_close(folded["a.weight"], torch.full((2, 3), 3**-0.5))


def test_fold_weight_norm_refuses_half_pairs():
    with pytest.raises(ValueError, match=r"needs both 'conv\.weight_g' and 'conv\.weight_v'"):
        fold_weight_norm({"conv.weight_g": torch.ones(2, 1, 1)})


# -- load_into -------------------------------------------------------------------------------


def test_load_into_does_not_copy_mapped_safetensors(tmp_path: Path):
    safetensors.torch.save_file(net_state(), tmp_path / "net.safetensors")
    loaded = load_state_dict(tmp_path / "net.safetensors")
    net = Net()
    result = load_into(net, loaded)
    assert result.missing == () and result.unexpected == ()
    for key, tensor in net.state_dict().items():
        assert tensor.data_ptr() == loaded[key].data_ptr(), key
    assert isinstance(net.proj.weight, nn.Parameter) and net.proj.weight.requires_grad
    assert "scale" in dict(net.named_buffers())
    assert_same_tensors(net.state_dict(), net_state())


def test_load_into_a_meta_model(tmp_path: Path):
    safetensors.torch.save_file(net_state(), tmp_path / "net.safetensors")
    loaded = load_state_dict(tmp_path / "net.safetensors")
    net = Net(device="meta")
    load_into(net, loaded)
    assert net.embed.weight.device.type == "cpu"
    assert net.embed.weight.data_ptr() == loaded["embed.weight"].data_ptr()
    assert net.cache.is_meta  # a non-persistent buffer is the engine's to fill


def test_load_into_reports_every_problem_at_once():
    sd = net_state()
    del sd["norm.bias"], sd["scale"]
    sd["proj.weight"] = sd["proj.weight"].t()[:3].contiguous()
    sd["embed.weight"] = sd["embed.weight"].double()
    sd["extra.weight"] = torch.ones(2)
    sd["cache"] = torch.ones(2)
    with pytest.raises(LoadError) as info:
        load_into(Net(), sd)
    message = str(info.value)
    assert "2 missing, 2 unexpected, 2 mismatched" in message
    assert "missing    norm.bias: expected float32[4]" in message
    assert "missing    scale: expected float32[4]" in message
    assert "unexpected extra.weight: found float32[2]" in message
    assert "unexpected cache: found float32[2]" in message
    assert "shape      proj.weight: expected float32[4, 4], found float32[3, 4]" in message
    assert "dtype      embed.weight: expected float32[11, 4], found float64[11, 4]" in message
    # In the module's state_dict order (its own buffer first), then the checkpoint's order.
    assert info.value.missing == ("scale", "norm.bias")
    assert info.value.unexpected == ("extra.weight", "cache")
    assert info.value.mismatched == ("embed.weight", "proj.weight")


def test_load_into_leaves_the_module_alone_when_it_fails():
    net = ops.init_random(Net(), torch.Generator().manual_seed(1))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    sd = net_state()
    sd["bad"] = torch.ones(1)
    with pytest.raises(LoadError):
        load_into(net, sd)
    assert_same_tensors(net.state_dict(), before)


def test_load_into_ignore_takes_names_and_globs():
    sd = net_state()
    del sd["norm.bias"]
    sd["rotary.inv_freq"] = torch.ones(2)
    result = load_into(Net(), sd, ignore=["norm.bias", "*.inv_freq"])
    assert result.missing == ("norm.bias",)
    assert result.unexpected == ("rotary.inv_freq",)


def test_load_into_not_strict_still_refuses_mismatches():
    sd = net_state()
    del sd["norm.bias"]
    assert load_into(Net(), sd, strict=False).missing == ("norm.bias",)
    sd["norm.weight"] = torch.ones(5)
    with pytest.raises(LoadError, match=r"shape +norm\.weight"):
        load_into(Net(), sd, strict=False)


def test_load_into_casts_only_when_asked():
    sd = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in net_state().items()}
    with pytest.raises(LoadError, match=r"cast=True converts it"):
        load_into(Net(), sd)
    net = Net()
    load_into(net, sd, cast=True)
    assert net.proj.weight.dtype == torch.float32
    assert torch.equal(net.proj.weight, sd["proj.weight"].float())


def test_load_into_never_casts_integer_dtypes():
    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    with pytest.raises(LoadError, match=r"dtype +count: expected int64\[\], found int32\[\]$"):
        load_into(Counter(), {"count": torch.zeros((), dtype=torch.int32)}, cast=True)


def test_load_into_keeps_tied_weights_tied():
    def tied() -> nn.Module:
        model = nn.ModuleDict(
            {"embed": ops.default.Embedding(6, 3), "head": ops.default.Linear(3, 6)}
        )
        model["head"].weight = model["embed"].weight
        return model

    weight, bias = torch.randn(6, 3), torch.randn(6)
    model = tied()
    load_into(model, {"embed.weight": weight, "head.bias": bias})
    assert model["head"].weight is model["embed"].weight
    assert model["embed"].weight.data_ptr() == weight.data_ptr()
    both = {"embed.weight": weight, "head.weight": weight.clone(), "head.bias": bias}
    load_into(tied(), both)
    both["head.weight"] = weight + 1
    with pytest.raises(
        LoadError, match=r"tied +head\.weight: shares one tensor with embed\.weight"
    ):
        load_into(tied(), both)


def test_load_into_hints_at_a_prefix():
    sd = {"model." + k: v for k, v in net_state().items()}
    with pytest.raises(LoadError, match=r"hint: the checkpoint's keys carry 'model\.'"):
        load_into(Net(), sd)
    load_into(Net(), strip_prefix(sd, "model."))


def test_load_into_hints_at_a_prefix_the_module_has():
    model = nn.ModuleDict({"model": Net()})
    with pytest.raises(LoadError, match=r"module's keys carry 'model\.'; replace_prefixes"):
        load_into(model, net_state())
    load_into(model, replace_prefixes(net_state(), {"": "model."}))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_load_onto_cuda_and_into_a_cuda_model(tmp_path: Path):
    safetensors.torch.save_file(net_state(), tmp_path / "net.safetensors")
    on_cuda = load_state_dict(tmp_path / "net.safetensors", device="cuda")
    assert all(t.is_cuda for t in on_cuda.values())
    net = Net(device="cuda")
    load_into(net, on_cuda)
    assert net.proj.weight.data_ptr() == on_cuda["proj.weight"].data_ptr()
    moved = Net(device="cuda")
    load_into(moved, load_state_dict(tmp_path / "net.safetensors"))  # CPU tensors are moved
    assert moved.proj.weight.is_cuda
    assert_same_tensors({k: v.cpu() for k, v in moved.state_dict().items()}, net_state())
