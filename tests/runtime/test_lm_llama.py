"""CausalDecoder on Llama checkpoints against transformers 5.24 in the same process, bit for bit.

Every checkpoint is a randomly initialised tiny LlamaForCausalLM written with ``save_pretrained``
and loaded by both sides from the same directory: prompt logits, each decode step's logits and
the tokens of a sampled generation must be identical (``torch.equal``), with dynamic and static
caches, left-padded batches, in float32 and in bfloat16 (where two transformers runs are equal bit
for bit too, so the tolerance is zero). ``inputs_embeds`` and ``output="hidden"`` are compared with
upstream's ``inputs_embeds=`` and ``LlamaModel(...).last_hidden_state``; ``from_state_dict`` with a
prefix, as a larger model (Sesame CSM) holds a Llama stack.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import DynamicCache as UpstreamDynamicCache
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.lm import CausalDecoder, DecoderConfig, QwenDecoder, UnsupportedModel, generate
from mizuoto_runtime.lm.rope import inv_frequencies
from mizuoto_runtime.sampling import SamplingParams
from mizuoto_runtime.weights.loading import LoadError, load_state_dict

VOCAB = 89
PAD = 0  # never in the prompts below
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 6.0,  # not a power of two: the order of its divisions shows
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8,  # short: every band of the ramp is hit
}


def save_llama(directory: Path, seed: int = 0, **overrides: object) -> Path:
    fields: dict[str, object] = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "bos_token_id": None,
        "eos_token_id": None,  # so that generate never stops a row early
        **overrides,
    }
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**fields))
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "norm" in name:  # upstream starts them at 0 and 1
                parameter.normal_(1.0 if "norm" in name else 0.0, 0.1)
    model.save_pretrained(directory)
    return directory


def load_both(directory: Path, dtype: torch.dtype = torch.float32):
    theirs = LlamaForCausalLM.from_pretrained(directory, dtype=dtype).eval()
    return theirs, CausalDecoder.from_pretrained(directory, dtype=dtype)


def prompt(rows: int = 2, length: int = 9, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))


def upstream_generate(model, ids: torch.Tensor, seed: int, **kwargs):
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        return model.generate(
            ids,
            disable_compile=True,
            return_dict_in_generate=True,
            output_logits=True,
            pad_token_id=PAD,
            **kwargs,
        )


def assert_same_generation(theirs, ours, ids, *, kv_cache="dynamic", mask=None, new=8, seed=3):
    """Every step's logits and the sampled tokens of one generation, bit for bit."""
    sampling = {"do_sample": True, "top_k": 20}
    upstream_kwargs: dict[str, object] = {"attention_mask": mask, **sampling}
    if kv_cache == "static":
        length = ids.shape[1] + new - 1  # what generate sizes its static cache to
        upstream_kwargs["cache"] = StaticCache(config=theirs.config, max_cache_len=length)
    out = upstream_generate(theirs, ids, seed, max_new_tokens=new, **upstream_kwargs)
    with RequestContext(seed=seed, settings={"compute.kv_cache": kv_cache}).bind():
        result = generate(
            ours,
            ids,
            SamplingParams(**sampling),
            max_new_tokens=new,
            padding_mask=mask,
            pad_token_id=PAD,
            output_logits=True,
        )
    assert result.logits is not None and len(result.logits) == len(out.logits)
    for step, (mine, reference) in enumerate(zip(result.logits, out.logits, strict=True)):
        assert torch.equal(mine, reference), f"step {step} differs"
    assert torch.equal(result.tokens, out.sequences)


CASES: dict[str, dict[str, object]] = {
    "mha-default": {"num_key_value_heads": 4},
    "gqa-head-dim-32-tied": {"head_dim": 32, "tie_word_embeddings": True},
    "mqa-biases": {"num_key_value_heads": 1, "attention_bias": True, "mlp_bias": True},
    "linear": {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}},
    "dynamic-grows": {
        "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
        "max_position_embeddings": 12,
    },
    "yarn": {
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 16,
        }
    },
    "llama3-gqa4-mlp-bias": {
        "rope_parameters": LLAMA3,
        "num_attention_heads": 8,
        "head_dim": 16,
        "mlp_bias": True,
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_prompt_logits_and_generation_equal_upstream(tmp_path: Path, case: str):
    theirs, ours = load_both(save_llama(tmp_path, **CASES[case]))
    ids = prompt()
    with torch.no_grad():
        expected = theirs(ids).logits
    with torch.inference_mode():
        assert torch.equal(ours(ids), expected)
    assert_same_generation(theirs, ours, ids)


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kv_heads=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([8, 16, 24]),
    attention_bias=st.booleans(),
    mlp_bias=st.booleans(),
    tied=st.booleans(),
    rope=st.sampled_from([None, "linear", "dynamic", "yarn", "llama3"]),
    seed=st.integers(0, 2**16),
)
def test_random_configs_equal_upstream(
    tmp_path_factory, kv_heads, head_dim, attention_bias, mlp_bias, tied, rope, seed
):
    overrides: dict[str, object] = {
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "attention_bias": attention_bias,
        "mlp_bias": mlp_bias,
        "tie_word_embeddings": tied,
        "max_position_embeddings": 16,
    }
    if rope == "llama3":
        overrides["rope_parameters"] = LLAMA3
    elif rope is not None:
        scaling: dict[str, object] = {"rope_type": rope, "rope_theta": 10000.0, "factor": 2.0}
        if rope == "yarn":
            scaling["original_max_position_embeddings"] = 8
        overrides["rope_parameters"] = scaling
    directory = save_llama(tmp_path_factory.mktemp("ckpt"), seed=seed, **overrides)
    theirs, ours = load_both(directory)
    ids = prompt(rows=1, length=7, seed=seed)
    with torch.no_grad():
        expected = theirs(ids).logits
    with torch.inference_mode():
        assert torch.equal(ours(ids), expected)
    assert_same_generation(theirs, ours, ids, new=10, seed=seed)


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
@pytest.mark.parametrize("factor", [8.0, 6.0, 3])
@pytest.mark.parametrize(
    ("low", "high", "original"), [(1.0, 4.0, 8), (1.0, 32.0, 64), (2, 16, 512), (1.0, 4.0, 8192)]
)
def test_llama3_frequencies_equal_upstreams(theta, factor, low, high, original):
    rope = {
        "rope_type": "llama3",
        "rope_theta": theta,
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": original,
    }
    for head_dim in (16, 64, 128):
        shape = {"hidden_size": 4 * head_dim, "num_attention_heads": 4, "head_dim": head_dim}
        shape["max_position_embeddings"] = 16384
        config = LlamaConfig(**shape, rope_parameters=dict(rope))
        expected, scaling = ROPE_INIT_FUNCTIONS["llama3"](config)
        raw = {"model_type": "llama", **shape, "rope_parameters": dict(rope)}
        mine, mine_scaling = inv_frequencies(DecoderConfig.from_dict(raw))
        assert torch.equal(mine, expected) and mine_scaling == scaling, f"head_dim={head_dim}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
def test_left_padded_batches_equal_upstream(tmp_path: Path, kv_cache: str, dtype: torch.dtype):
    overrides = {"rope_parameters": LLAMA3, "attention_bias": True, "mlp_bias": True}
    theirs, ours = load_both(save_llama(tmp_path, seed=4, **overrides), dtype)
    ids = prompt(rows=3, length=8)
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = PAD, 0
    ids[2, :1], mask[2, :1] = PAD, 0
    assert_same_generation(theirs, ours, ids, kv_cache=kv_cache, mask=mask)


def test_bfloat16_runs_of_transformers_agree_bit_for_bit_and_so_do_ours(tmp_path: Path):
    theirs, ours = load_both(save_llama(tmp_path, rope_parameters=LLAMA3), torch.bfloat16)
    ids = prompt()
    with torch.no_grad():
        first, second = theirs(ids).logits, theirs(ids).logits
    assert torch.equal(first, second)  # the tolerance bfloat16 is held to: none
    with torch.inference_mode():
        assert torch.equal(ours(ids), first)
    assert_same_generation(theirs, ours, ids, kv_cache="static")


def test_inputs_embeds_and_hidden_states_equal_upstream(tmp_path: Path):
    theirs, ours = load_both(save_llama(tmp_path, head_dim=32, mlp_bias=True))
    embeds = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(2))
    ids = prompt(length=7)
    with torch.no_grad():
        logits = theirs(inputs_embeds=embeds).logits
        hidden = theirs.model(inputs_embeds=embeds).last_hidden_state
        hidden_of_ids = theirs.model(ids).last_hidden_state
    with torch.inference_mode():
        assert torch.equal(ours(inputs_embeds=embeds), logits)
        assert torch.equal(ours(inputs_embeds=embeds, output="hidden"), hidden)
        assert torch.equal(ours(ids, output="hidden"), hidden_of_ids)
        last = ours(ids, output="hidden", logits_to_keep=1)
    assert torch.equal(last, hidden_of_ids[:, -1:])


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
def test_cached_steps_from_embeddings_equal_upstream(tmp_path: Path, kv_cache: str):
    theirs, ours = load_both(save_llama(tmp_path, rope_parameters=LLAMA3))
    gen = torch.Generator().manual_seed(6)
    steps = [torch.randn(2, length, 64, generator=gen) for length in (5, 1, 1, 2)]
    total = sum(x.shape[1] for x in steps)
    reference: object = UpstreamDynamicCache(config=theirs.config)
    if kv_cache == "static":
        reference = StaticCache(config=theirs.config, max_cache_len=total)
    cache = ours.new_cache(kv_cache, batch=2, max_length=total)
    for step, x in enumerate(steps):
        with torch.no_grad():
            expected = theirs.model(inputs_embeds=x, cache=reference, use_cache=True)
        with torch.inference_mode():
            mine = ours(inputs_embeds=x, cache=cache, output="hidden")
        assert torch.equal(mine, expected.last_hidden_state), f"step {step} differs"


def csm_like(directory: Path) -> dict[str, torch.Tensor]:
    """A Llama checkpoint's tensors laid out as CSM lays out its backbone."""
    state = load_state_dict(directory)
    out = {"backbone_model." + k.removeprefix("model."): v for k, v in state.items()}
    out.pop("backbone_model.lm_head.weight")
    out["backbone_model.embed_tokens.embed_audio_tokens.weight"] = out.pop(
        "backbone_model.embed_tokens.weight"
    )
    out["backbone_model.inputs_embeds_projector.weight"] = torch.zeros(64, 32)
    out["lm_head.weight"] = state["lm_head.weight"]
    out["depth_decoder.model.norm.weight"] = torch.ones(64)  # another model's: left alone
    return out


def test_from_state_dict_loads_a_prefix_without_embedding_or_head(tmp_path: Path):
    directory = save_llama(tmp_path, attention_bias=True, mlp_bias=True)
    theirs, _ = load_both(directory)
    config = DecoderConfig.from_pretrained(directory)
    state = csm_like(directory)
    skip = ("embed_tokens", "inputs_embeds_projector")
    backbone = CausalDecoder.from_state_dict(
        config, state, prefix="backbone_model.", head=False, skip=skip
    )
    with_head = CausalDecoder.from_state_dict(config, state, prefix="backbone_model.", skip=skip)
    assert backbone.lm_head is None and backbone.model.embed_tokens is None
    embeds = torch.randn(2, 6, 64, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        hidden = theirs.model(inputs_embeds=embeds).last_hidden_state
        logits = theirs(inputs_embeds=embeds).logits
    with torch.inference_mode():
        assert torch.equal(backbone(inputs_embeds=embeds, output="hidden"), hidden)
        assert torch.equal(with_head(inputs_embeds=embeds), logits)
    with pytest.raises(ValueError, match="head=False"):
        backbone(inputs_embeds=embeds)
    with pytest.raises(ValueError, match="embed=False"):
        backbone(prompt(), output="hidden")
    bf16 = CausalDecoder.from_state_dict(
        config, state, prefix="backbone_model.", head=False, skip=skip, dtype=torch.bfloat16
    )
    assert bf16.dtype == torch.bfloat16 and bf16.model.rotary_emb.inv_freq.dtype == torch.float32


def test_from_state_dict_is_strict_and_names_the_checkpoints_keys(tmp_path: Path):
    directory = save_llama(tmp_path, mlp_bias=True)
    config = DecoderConfig.from_pretrained(directory)
    state = csm_like(directory)
    with pytest.raises(LoadError) as unexpected:  # the projector is not the decoder's
        CausalDecoder.from_state_dict(
            config, state, prefix="backbone_model.", head=False, skip=("embed_tokens",)
        )
    assert unexpected.value.unexpected == ("backbone_model.inputs_embeds_projector.weight",)
    assert "backbone_model.inputs_embeds_projector.weight" in str(unexpected.value)
    del state["backbone_model.layers.1.mlp.up_proj.bias"]
    with pytest.raises(LoadError) as missing:
        CausalDecoder.from_state_dict(
            config,
            state,
            prefix="backbone_model.",
            skip=("embed_tokens", "inputs_embeds_projector"),
        )
    assert missing.value.missing == ("backbone_model.layers.1.mlp.up_proj.bias",)


def test_forward_refuses_ambiguous_inputs(tmp_path: Path):
    _, ours = load_both(save_llama(tmp_path))
    ids, embeds = prompt(), torch.zeros(2, 9, 64)
    for kwargs, field in (
        ({"input_ids": ids, "inputs_embeds": embeds}, "inputs_embeds"),
        ({}, "input_ids"),
        ({"inputs_embeds": torch.zeros(2, 9, 32)}, "inputs_embeds"),
        ({"input_ids": ids, "output": "probabilities"}, "output"),
    ):
        with pytest.raises(ValueError, match=field):
            ours(**kwargs)


def test_config_defaults_follow_llama_config():
    llama = DecoderConfig.from_dict(
        {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "head_dim": None}
    )
    upstream = LlamaConfig(hidden_size=64, num_attention_heads=4)
    assert llama.head_dim == upstream.head_dim == 16
    assert llama.num_key_value_heads == upstream.num_key_value_heads == 4
    assert llama.vocab_size == upstream.vocab_size
    assert llama.max_position_embeddings == upstream.max_position_embeddings
    assert llama.eos_token_id == (upstream.eos_token_id,)
    assert (llama.qkv_bias, llama.o_bias, llama.mlp_bias, llama.qk_norm) == (False,) * 4
    biased = DecoderConfig.from_dict({"model_type": "llama", "attention_bias": True, "mlp_bias": 1})
    assert (biased.qkv_bias, biased.o_bias, biased.mlp_bias) == (True, True, True)
    scaled = DecoderConfig.from_dict(
        {"model_type": "llama", "max_position_embeddings": 128, "rope_scaling": {**LLAMA3}}
    )
    assert scaled.rope.low_freq_factor == 1.0 and scaled.rope.original_max_position_embeddings == 8
    assert QwenDecoder is CausalDecoder


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"model_type": "mistral"}, "model_type"),
        ({"model_type": None}, "model_type"),
        (
            {"model_type": "llama", "rope_scaling": {**LLAMA3, "low_freq_factor": None}},
            "rope_parameters.low_freq_factor",
        ),
        (
            {"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
            "rope_parameters.low_freq_factor",
        ),
        (
            {"model_type": "llama", "rope_scaling": {"rope_type": "longrope"}},
            "rope_parameters.rope_type",
        ),
    ],
)
def test_unsupported_configs_name_the_field_and_the_known_families(raw, field):
    with pytest.raises(UnsupportedModel) as raised:
        DecoderConfig.from_dict(raw)
    assert raised.value.field == field
    if field == "model_type":
        assert all(family in str(raised.value) for family in ("qwen2", "qwen3", "llama"))
