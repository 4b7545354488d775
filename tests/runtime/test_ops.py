"""ops.default, ops.cast and init_random, checked against torch.nn itself."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.overrides import TorchFunctionMode

from mizuoto_runtime import ops

# (layer name, constructor args, constructor kwargs, input shape or "tokens")
LAYERS = [
    ("Linear", (12, 7), {}, (3, 12)),
    ("Linear", (12, 7), {"bias": False}, (3, 12)),
    ("Conv1d", (4, 6, 3), {"padding": 1}, (2, 4, 9)),
    ("Conv1d", (4, 6, 5), {"groups": 2, "padding_mode": "reflect", "padding": 2}, (2, 4, 9)),
    ("Conv2d", (3, 5, (3, 2)), {"stride": 2}, (2, 3, 8, 7)),
    ("ConvTranspose1d", (4, 6, 4), {"stride": 2, "groups": 2}, (2, 4, 9)),
    ("ConvTranspose2d", (3, 5, 3), {"stride": 2, "output_padding": 1}, (2, 3, 5, 4)),
    ("Embedding", (20, 6), {}, "tokens"),
    ("Embedding", (20, 6), {"padding_idx": 3}, "tokens"),
    ("LayerNorm", (10,), {}, (3, 10)),
    ("LayerNorm", (10,), {"bias": False}, (3, 10)),
    ("GroupNorm", (2, 6), {}, (3, 6, 5)),
    ("RMSNorm", (10,), {}, (3, 10)),
]
IDS = [f"{name}-{i}" for i, (name, *_) in enumerate(LAYERS)]


def make_input(shape, generator: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    if shape == "tokens":
        return torch.randint(0, 20, (3, 5), generator=generator)
    return torch.randn(shape, generator=generator, dtype=dtype)


def seeded_torch_nn(name: str, args, kwargs, seed: int) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return getattr(nn, name)(*args, **kwargs)


class RecordCalls(TorchFunctionMode):
    """Records the name of every torch function and tensor method called inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("name", "args", "kwargs", "shape"), LAYERS, ids=IDS)
@pytest.mark.parametrize("namespace", [ops.default, ops.cast], ids=["default", "cast"])
def test_layers_match_torch_nn_in_names_shapes_dtypes(namespace, name, args, kwargs, shape):
    ours = getattr(namespace, name)(*args, **kwargs, dtype=torch.bfloat16)
    theirs = getattr(nn, name)(*args, **kwargs, dtype=torch.bfloat16)
    assert isinstance(ours, getattr(nn, name))
    assert {k: (v.shape, v.dtype) for k, v in ours.state_dict().items()} == {
        k: (v.shape, v.dtype) for k, v in theirs.state_dict().items()
    }
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize(("name", "args", "kwargs", "shape"), LAYERS, ids=IDS)
def test_construction_draws_no_random_numbers_and_initialises_nothing(name, args, kwargs, shape):
    before = torch.get_rng_state()
    with RecordCalls() as calls:
        layer = getattr(ops.default, name)(*args, **kwargs)
    assert torch.equal(torch.get_rng_state(), before)
    initialisers = {"uniform_", "normal_", "fill_", "zero_", "kaiming_uniform_", "ones_", "zeros_"}
    assert not initialisers & set(calls.names), calls.names
    assert layer.weight is not None
    # The control: torch.nn's constructor does initialise (and, for most layers, draws).
    with RecordCalls() as calls:
        getattr(nn, name)(*args, **kwargs)
    assert initialisers & set(calls.names)


def test_torch_nn_construction_does_move_the_global_generator():
    # The control for the test above: the comparison of generator states can see a draw.
    before = torch.get_rng_state()
    with torch.random.fork_rng(devices=[]):
        nn.Linear(4, 4)
        assert not torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize(("name", "args", "kwargs", "shape"), LAYERS, ids=IDS)
def test_meta_construction(name, args, kwargs, shape):
    layer = getattr(ops.default, name)(*args, **kwargs, device="meta")
    reference = getattr(nn, name)(*args, **kwargs, device="meta")
    assert all(p.is_meta for p in layer.parameters())
    assert [(k, v.shape) for k, v in layer.state_dict().items()] == [
        (k, v.shape) for k, v in reference.state_dict().items()
    ]
    ops.init_random(layer, torch.Generator())  # nothing to fill, and no error


@pytest.mark.parametrize(("name", "args", "kwargs", "shape"), LAYERS, ids=IDS)
@pytest.mark.parametrize("namespace", [ops.default, ops.cast], ids=["default", "cast"])
def test_forward_equals_torch_nn_given_the_same_weights(namespace, name, args, kwargs, shape):
    reference = seeded_torch_nn(name, args, kwargs, seed=1)
    ours = getattr(namespace, name)(*args, **kwargs)
    ours.load_state_dict(reference.state_dict())
    x = make_input(shape, torch.Generator().manual_seed(2))
    assert torch.equal(ours(x), reference(x))


@pytest.mark.parametrize(("name", "args", "kwargs", "shape"), LAYERS, ids=IDS)
@pytest.mark.parametrize("seed", [0, 1234])
def test_init_random_equals_torch_nn_after_manual_seed_bitwise(name, args, kwargs, shape, seed):
    reference = seeded_torch_nn(name, args, kwargs, seed)
    ours = ops.init_random(
        getattr(ops.default, name)(*args, **kwargs), torch.Generator().manual_seed(seed)
    )
    assert list(ours.state_dict()) == list(reference.state_dict())
    for key, value in reference.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key


@settings(max_examples=30, deadline=None)
@given(
    in_features=st.integers(1, 40),
    out_features=st.integers(1, 40),
    kernel=st.integers(1, 5),
    bias=st.booleans(),
    seed=st.integers(0, 2**63 - 1),
)
def test_init_random_bitwise_for_any_shape(in_features, out_features, kernel, bias, seed):
    layers = [
        ("Linear", (in_features, out_features)),
        ("Conv1d", (in_features, out_features, kernel)),
    ]
    for name, args in layers:
        reference = seeded_torch_nn(name, args, {"bias": bias}, seed)
        ours = getattr(ops.default, name)(*args, bias=bias)
        ops.init_random(ours, torch.Generator().manual_seed(seed))
        for key, value in reference.state_dict().items():
            assert torch.equal(ours.state_dict()[key], value), (name, key)


class Block(nn.Module):
    """A decoder-shaped model that takes its layers from a namespace (torch.nn or ops.*)."""

    def __init__(self, layers, width: int = 16) -> None:
        super().__init__()
        self.embed = layers.Embedding(50, width, padding_idx=0)
        self.norm = layers.RMSNorm(width)
        self.qkv = layers.Linear(width, 3 * width, bias=False)
        self.out = layers.Linear(width, width)
        self.conv = layers.Conv1d(width, width, 3, padding=1, groups=4)
        self.group_norm = layers.GroupNorm(4, width)
        self.upsample = layers.ConvTranspose1d(width, 8, 4, stride=2)
        self.final_norm = layers.LayerNorm(8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.embed(tokens))  # [b, t, w]
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        h = h + self.out(torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v)
        h = self.group_norm(self.conv(h.transpose(1, 2)))  # [b, w, t]
        return self.final_norm(self.upsample(h).transpose(1, 2))  # [b, 2t + 2, 8]


def test_init_random_reproduces_a_whole_torch_nn_model_bitwise():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        reference = Block(nn)
    before = torch.get_rng_state()
    ours = ops.init_random(Block(ops.default), torch.Generator().manual_seed(7))
    assert torch.equal(torch.get_rng_state(), before)
    for key, value in reference.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    assert torch.all(ours.embed.weight[0] == 0)
    tokens = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(3))
    assert torch.equal(ours(tokens), reference(tokens))


def test_init_random_matches_torch_nn_layers_tied_after_construction():
    def tied(layers):
        model = nn.ModuleDict({"embed": layers.Embedding(10, 4), "head": layers.Linear(4, 10)})
        model["head"].weight = model["embed"].weight
        return model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        reference = tied(nn)
    ours = ops.init_random(tied(ops.default), torch.Generator().manual_seed(0))
    assert ours["head"].weight is ours["embed"].weight
    # The head's own weight draw is spent and discarded, so its bias matches torch.nn's too.
    for key, value in reference.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key


def test_init_random_fills_plain_torch_nn_layers_too():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        reference = nn.Linear(6, 3)
    layer = ops.init_random(nn.Linear(6, 3), torch.Generator().manual_seed(5))
    assert torch.equal(layer.weight, reference.weight)
    assert torch.equal(layer.bias, reference.bias)


def test_init_random_names_modules_with_parameters_it_does_not_know():
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.empty(3))

    model = nn.Sequential(ops.default.Linear(3, 3), Scaled())
    with pytest.raises(TypeError, match=r"1 \(Scaled\)"):
        ops.init_random(model, torch.Generator())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_init_random_refuses_a_generator_on_another_device():
    layer = ops.default.Linear(3, 3, device="cuda")
    with pytest.raises(ValueError, match="weight is on cuda"):
        ops.init_random(layer, torch.Generator())


@pytest.mark.parametrize(("name", "args", "kwargs", "shape"), LAYERS, ids=IDS)
def test_cast_computes_bf16_weights_in_the_inputs_fp32(name, args, kwargs, shape):
    reference = seeded_torch_nn(name, args, kwargs, seed=3).to(torch.bfloat16)
    stored = getattr(ops.cast, name)(*args, **kwargs, dtype=torch.bfloat16)
    stored.load_state_dict(reference.state_dict())
    x = make_input(shape, torch.Generator().manual_seed(4))
    # What the layer should compute: torch.nn with the bf16 weights widened to fp32.
    expected = reference.float()(x)
    out = stored(x)
    assert out.dtype == (torch.bfloat16 if shape == "tokens" else torch.float32)
    if shape == "tokens":
        out = out.float()
    assert torch.equal(out, expected)
    assert all(p.dtype == torch.bfloat16 for p in stored.parameters())


@pytest.mark.parametrize(("name", "args", "kwargs", "shape"), LAYERS, ids=IDS)
def test_cast_does_not_copy_when_dtype_and_device_match(name, args, kwargs, shape):
    layer = ops.init_random(getattr(ops.cast, name)(*args, **kwargs), torch.Generator())
    x = make_input(shape, torch.Generator())
    with RecordCalls() as calls:
        layer(x)
    assert "to" not in calls.names


def test_cast_follows_the_inputs_device():
    layer = ops.init_random(ops.cast.Linear(4, 3, dtype=torch.bfloat16), torch.Generator())
    out = layer(torch.empty(2, 4, device="meta"))
    assert out.device.type == "meta" and out.dtype == torch.float32
    assert layer.weight.device.type == "cpu"


def test_cast_embedding_converts_only_the_gathered_rows():
    table = ops.init_random(ops.cast.Embedding(20, 6, dtype=torch.bfloat16), torch.Generator())
    tokens = torch.tensor([[1, 2, 19]])
    out = table(tokens, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert torch.equal(out, table.weight.float()[tokens])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cast_moves_host_weights_to_the_inputs_cuda_device():
    layer = ops.init_random(ops.cast.Linear(8, 4, dtype=torch.bfloat16), torch.Generator())
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0)).cuda()
    out = layer(x)
    assert out.is_cuda and out.dtype == torch.float32 and layer.weight.device.type == "cpu"
    expected = torch.nn.functional.linear(x, layer.weight.cuda().float(), layer.bias.cuda().float())
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
