"""wav2vec 2.0, HuBERT and WavLM against transformers 5.24 in the same process, bit for bit.

Every checkpoint is a randomly initialised tiny ``Wav2Vec2Model`` / ``HubertModel`` / ``WavLMModel``
written with ``save_pretrained``; both sides load the same folder. Each config varies what changes
the forward: the feature extractor's norm and stack, conv bias, pre- or post-norm layers, the
positional conv's kernel (odd and even) and groups, heads, activations, HuBERT's batch-norm
positional conv and projection norm, the pre-norm layers' attention adapters (MMS), WavLM's
buckets. float32 and bfloat16 are both compared with
``torch.equal``: the same operations in the same order give the same bits in either precision.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from transformers import (
    HubertConfig,
    HubertModel,
    Wav2Vec2Config,
    Wav2Vec2ForCTC,
    Wav2Vec2Model,
    WavLMConfig,
    WavLMModel,
)

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.memory.stream import stage_bytes
from mizuoto_runtime.nn import load_speech_encoder
from mizuoto_runtime.runtime import Runtime
from mizuoto_sdk.compute import ComputeSettings
from mizuoto_sdk.errors import EngineUnavailable

FAMILIES = {
    "wav2vec2": (Wav2Vec2Config, Wav2Vec2Model),
    "hubert": (HubertConfig, HubertModel),
    "wavlm": (WavLMConfig, WavLMModel),
}
SMALL = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 48,
    "conv_dim": (16, 16, 16),
    "conv_kernel": (10, 3, 3),
    "conv_stride": (5, 2, 2),
    "num_conv_pos_embeddings": 8,
    "num_conv_pos_embedding_groups": 4,
}
# (family, what differs from SMALL): each config changes some part of the forward
CASES = [
    ("wav2vec2", {}),
    (
        "wav2vec2",
        {
            "feat_extract_norm": "layer",
            "do_stable_layer_norm": True,
            "conv_bias": True,
            "num_conv_pos_embeddings": 7,
            "num_attention_heads": 2,
            "hidden_act": "gelu_new",
            "adapter_attn_dim": 6,
            "conv_dim": (8, 12, 16, 16),
            "conv_kernel": (8, 4, 3, 2),
            "conv_stride": (4, 3, 2, 2),
        },
    ),
    ("hubert", {"conv_pos_batch_norm": True, "feat_proj_layer_norm": False, "hidden_act": "relu"}),
    (
        "hubert",
        {
            "do_stable_layer_norm": True,
            "num_hidden_layers": 3,
            "layer_norm_eps": 1e-3,
            "adapter_attn_dim": 4,
        },
    ),
    ("wavlm", {"num_buckets": 64, "max_bucket_distance": 40}),
    (
        "wavlm",
        {
            "do_stable_layer_norm": True,
            "feat_extract_norm": "layer",
            "num_conv_pos_embeddings": 5,
            "num_attention_heads": 8,
            "feat_extract_activation": "silu",
            "mask_time_prob": 0.0,
        },
    ),
]
IDS = [f"{family}-{i}" for i, (family, _) in enumerate(CASES)]


def save_checkpoint(folder: Path, family: str, seed: int = 0, **overrides: object) -> Path:
    config_class, model_class = FAMILIES[family]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config_class(**{**SMALL, **overrides}))
    model.save_pretrained(folder)
    return folder


def audio(batch: int = 2, samples: int = 2000, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, samples, generator=torch.Generator().manual_seed(seed))


def upstream(folder: Path, family: str, x: torch.Tensor, mask=None, dtype=torch.float32):
    model = FAMILIES[family][1].from_pretrained(folder, dtype=dtype).eval()
    with torch.no_grad():
        return model(x.to(dtype), attention_mask=mask, output_hidden_states=True)


def assert_equal_states(ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...]) -> None:
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        assert torch.equal(a, b), f"hidden state {i}: max diff {(a - b).abs().max().item()}"


@pytest.mark.parametrize(("family", "overrides"), CASES, ids=IDS)
def test_every_hidden_state_equals_upstream_in_float32(tmp_path, family, overrides):
    folder = save_checkpoint(tmp_path, family, **overrides)
    x = audio()
    expected = upstream(folder, family, x)
    encoder = load_speech_encoder(folder)
    with torch.inference_mode():
        states = encoder(x)
        assert_equal_states(states, expected.hidden_states)
        assert torch.equal(encoder.last_hidden_state(states), expected.last_hidden_state)


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")  # torch, upstream's
@pytest.mark.parametrize("family", FAMILIES)
def test_a_padded_batch_equals_upstream_with_its_attention_mask(tmp_path, family):
    folder = save_checkpoint(tmp_path, family, do_stable_layer_norm=family == "hubert")
    x = audio(3, 1600)
    mask = torch.ones(3, 1600, dtype=torch.long)
    mask[1, 1000:] = 0
    mask[2, 500:] = 0
    x = x * mask  # padding holds zeros, as a feature extractor pads
    expected = upstream(folder, family, x, mask)
    unpadded = upstream(folder, family, x, torch.ones_like(mask))
    encoder = load_speech_encoder(folder)
    with torch.inference_mode():
        assert_equal_states(encoder(x, mask), expected.hidden_states)
        assert_equal_states(encoder(x, torch.ones_like(mask)), unpadded.hidden_states)


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_equals_upstream_bit_for_bit(tmp_path, family):
    folder = save_checkpoint(tmp_path, family, seed=2, conv_pos_batch_norm=family == "hubert")
    x = audio(seed=3)
    expected = upstream(folder, family, x, dtype=torch.bfloat16)
    encoder = load_speech_encoder(folder, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert_equal_states(encoder(x), expected.hidden_states)  # float32 audio is cast


def test_a_sharded_task_checkpoint_loads_its_base_model(tmp_path):
    with torch.random.fork_rng():
        torch.manual_seed(4)
        model = Wav2Vec2ForCTC(Wav2Vec2Config(**SMALL, vocab_size=11))
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    x = audio(1)
    with torch.no_grad():
        expected = model.eval()(x, output_hidden_states=True).hidden_states
    with torch.inference_mode():
        assert_equal_states(load_speech_encoder(tmp_path)(x), expected)


@pytest.mark.parametrize(
    ("family", "field", "value"),
    [
        ("wav2vec2", "add_adapter", True),
        ("wavlm", "hidden_act", "gelu_10"),
        ("hubert", "feat_extract_activation", "mish"),
    ],
)
def test_a_config_field_it_does_not_build_is_refused_by_name(tmp_path, family, field, value):
    save_checkpoint(tmp_path, family, **{field: value})
    with pytest.raises(EngineUnavailable, match=field):
        load_speech_encoder(tmp_path)


@pytest.fixture(scope="module")
def wav2vec2_folder(tmp_path_factory) -> Path:
    return save_checkpoint(tmp_path_factory.mktemp("wav2vec2"), "wav2vec2", num_hidden_layers=4)


def test_loading_draws_nothing_from_the_global_generator(wav2vec2_folder):
    before = torch.get_rng_state()
    load_speech_encoder(wav2vec2_folder)
    assert torch.equal(torch.get_rng_state(), before)


def test_bad_input_is_a_value_error_naming_the_argument(wav2vec2_folder):
    encoder = load_speech_encoder(wav2vec2_folder)
    with pytest.raises(ValueError, match=r"audio: expected a float tensor \[batch, samples\]"):
        encoder(audio()[0])
    with pytest.raises(ValueError, match=r"audio: 30 samples are too few; .* at least 40"):
        encoder(audio(1, 30))
    with pytest.raises(ValueError, match="attention_mask: expected"):
        encoder(audio(2, 100), torch.ones(2, 99))
    short = torch.ones(2, 100)
    short[1, 10:] = 0
    with pytest.raises(ValueError, match="attention_mask: every row needs at least 40"):
        encoder(audio(2, 100), short)


def test_streamed_layers_give_the_resident_output_bit_for_bit(wav2vec2_folder):
    encoder = load_speech_encoder(wav2vec2_folder)
    (handle,) = encoder.handles
    x = audio()
    with torch.inference_mode():
        expected = encoder(x)
    unit = handle.unit_parts[0]
    room = handle.base.nbytes + unit.nbytes + 2 * stage_bytes(unit)  # one layer stays resident
    rt = Runtime(settings={"compute.simulate_vram_mb": room / 2**20})
    rt.manager.register([handle], owner="wav2vec2@cpu")
    with torch.inference_mode(), rt.manager.use(handle, phase="encode", working_bytes=0):
        states = encoder(x)
    assert handle.streamed_bytes >= 3 * unit.nbytes
    assert_equal_states(states, expected)


def test_concurrent_calls_each_get_their_own_result(wav2vec2_folder):
    encoder = load_speech_encoder(wav2vec2_folder)
    inputs = [audio(1, 1200 + 300 * i, seed=i) for i in range(4)]
    with torch.inference_mode():
        expected = [encoder(x)[-1] for x in inputs]
    results: dict[int, torch.Tensor] = {}

    def work(i: int) -> None:
        with torch.inference_mode():
            results[i] = encoder(inputs[i])[-1]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(torch.equal(results[i], expected[i]) for i in range(4))


@pytest.mark.parametrize(("family", "site"), [("hubert", "wav2vec2"), ("wavlm", "wavlm")])
def test_attention_runs_through_its_accel_site(tmp_path, family, site):
    encoder = load_speech_encoder(save_checkpoint(tmp_path, family))
    x = audio(1)
    with torch.inference_mode():
        expected = encoder(x)
        ctx = RequestContext(compute=ComputeSettings(attention="math"))
        with ctx.bind():
            states = encoder(x)
    assert ctx.applied["attention"] == {f"{site}.self_attention": "math"}
    for ours, reference in zip(states, expected, strict=True):
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_equals_upstream_on_cuda(tmp_path, family, dtype):
    folder = save_checkpoint(tmp_path, family)
    x = audio().to("cuda", dtype)
    model = FAMILIES[family][1].from_pretrained(folder, dtype=dtype).to("cuda").eval()
    with torch.no_grad():
        expected = model(x, output_hidden_states=True).hidden_states
    with torch.inference_mode():
        assert_equal_states(load_speech_encoder(folder, device="cuda", dtype=dtype)(x), expected)
