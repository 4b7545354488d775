"""QwenDecoder against transformers 5.24 in the same process, bit for bit.

Every checkpoint is a randomly initialised tiny Qwen2ForCausalLM / Qwen3ForCausalLM written with
``save_pretrained`` and loaded by both sides from the same directory: prompt logits, each decode
step's logits and the generated tokens must be identical (``torch.equal``), in float32 and in
bfloat16 (``from_pretrained(dtype=torch.bfloat16)`` on their side, ``dtype=`` on ours).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from mizuoto_contract.snapshot import snapshot
from mizuoto_runtime.lm import QwenConfig, QwenDecoder, UnsupportedModel, generate
from mizuoto_runtime.sampling import SamplingParams
from mizuoto_runtime.weights.loading import load_into, load_state_dict

FAMILIES = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}
VOCAB = 97
PAD = 0  # never in the prompts below, so generate infers no padding


def save_checkpoint(directory: Path, family: str, seed: int = 0, **overrides: object) -> Path:
    """A random tiny model of ``family`` saved with save_pretrained into ``directory``."""
    config_class, model_class = FAMILIES[family]
    fields: dict[str, object] = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
    }
    if family == "qwen3":
        fields["head_dim"] = 16
    fields.update(overrides)
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        model = model_class(config_class(**fields))
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "norm" in name:  # upstream starts them at 0 and 1
                parameter.normal_(1.0 if "norm" in name else 0.0, 0.1)
    model.save_pretrained(directory)
    return directory


def load_both(directory: Path, family: str, dtype: torch.dtype):
    theirs = FAMILIES[family][1].from_pretrained(directory, dtype=dtype).eval()
    return theirs, QwenDecoder.from_pretrained(directory, dtype=dtype)


def prompt(rows: int = 2, length: int = 9, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))


def upstream_generate(model, ids: torch.Tensor, seed: int = 0, **kwargs):
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


def assert_same_run(
    theirs, ours: QwenDecoder, ids: torch.Tensor, new: int = 8, seed: int = 0, **kwargs
) -> None:
    """Prompt logits, every step's logits and the tokens of one generation, bit for bit."""
    with torch.no_grad():
        expected_prompt = theirs(ids).logits
    with torch.inference_mode():
        assert torch.equal(ours(ids), expected_prompt)
    out = upstream_generate(theirs, ids, seed=seed, max_new_tokens=new, **kwargs)
    params = SamplingParams(**kwargs)
    result = generate(
        ours,
        ids,
        params,
        max_new_tokens=new,
        generator=torch.Generator().manual_seed(seed),
        pad_token_id=PAD,
        output_logits=True,
    )
    assert result.logits is not None and result.logits.shape[0] == len(out.logits)
    for step, (mine, reference) in enumerate(zip(result.logits, out.logits, strict=True)):
        assert torch.equal(mine, reference), f"step {step} differs"
    assert torch.equal(result.tokens, out.sequences)


CASES = {
    "qwen2": ("qwen2", {}),
    "qwen2-tied-mha": ("qwen2", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    "qwen2-mqa-head-dim-32": ("qwen2", {"num_key_value_heads": 1, "head_dim": 32}),
    "qwen2-theta-1e6": ("qwen2", {"rope_theta": 1e6}),
    "qwen2-yarn": (
        "qwen2",
        {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        },
    ),
    "qwen3": ("qwen3", {}),
    "qwen3-bias-tied-gqa4": (
        "qwen3",
        {"attention_bias": True, "tie_word_embeddings": True, "num_attention_heads": 8},
    ),
    "qwen3-head-dim-32": ("qwen3", {"head_dim": 32, "num_key_value_heads": 1}),
    "qwen3-linear": ("qwen3", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "qwen3-dynamic-grows": (
        "qwen3",
        {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 12},
    ),
    "qwen3-yarn-options": (
        "qwen3",
        {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 16,
                "beta_fast": 16,
                "beta_slow": 2,
                "attention_factor": 1.3,
            }
        },
    ),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_and_greedy_tokens_equal_upstream(tmp_path: Path, case: str, dtype: torch.dtype):
    family, overrides = CASES[case]
    directory = save_checkpoint(tmp_path, family, **overrides)
    theirs, ours = load_both(directory, family, dtype)
    assert_same_run(theirs, ours, prompt(), new=8)


SAMPLING = {
    "defaults": {"do_sample": True},
    "warpers": {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": 0.05},
    "penalties": {
        "do_sample": True,
        "repetition_penalty": 1.3,
        "eos_token_id": [5, 9],
        "min_new_tokens": 3,
        "suppress_tokens": [11],
    },
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", sorted(SAMPLING))
def test_sampled_tokens_equal_generate_after_manual_seed(
    tmp_path: Path, case: str, dtype: torch.dtype
):
    directory = save_checkpoint(tmp_path, "qwen3", seed=3)
    theirs, ours = load_both(directory, "qwen3", dtype)
    assert_same_run(theirs, ours, prompt(seed=4), new=10, seed=42, **SAMPLING[case])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_left_padded_batches_equal_upstream(tmp_path: Path, family: str):
    directory = save_checkpoint(tmp_path, family)
    theirs, ours = load_both(directory, family, torch.float32)
    ids = prompt(rows=3, length=8)
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = PAD, 0
    ids[2, :1], mask[2, :1] = PAD, 0
    kwargs = {"do_sample": True, "top_k": 10, "repetition_penalty": 1.2}
    out = upstream_generate(theirs, ids, seed=7, attention_mask=mask, max_new_tokens=8, **kwargs)
    result = generate(
        ours,
        ids,
        SamplingParams(**kwargs),
        max_new_tokens=8,
        generator=torch.Generator().manual_seed(7),
        padding_mask=mask,
        pad_token_id=PAD,
        output_logits=True,
    )
    assert all(torch.equal(a, b) for a, b in zip(result.logits, out.logits, strict=True))
    assert torch.equal(result.tokens, out.sequences)


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    kv_heads=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([8, 16, 24]),
    bias=st.booleans(),
    tied=st.booleans(),
    rope=st.sampled_from([None, "linear", "dynamic", "yarn"]),
    seed=st.integers(0, 2**16),
)
def test_random_configs_equal_upstream(
    tmp_path_factory, family, kv_heads, head_dim, bias, tied, rope, seed
):
    overrides: dict[str, object] = {
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "tie_word_embeddings": tied,
        "max_position_embeddings": 16,
    }
    if family == "qwen3":
        overrides["attention_bias"] = bias
    if rope is not None:
        scaling: dict[str, object] = {"rope_type": rope, "factor": 2.0}
        if rope == "yarn":
            scaling["original_max_position_embeddings"] = 8
        overrides["rope_scaling"] = scaling
    directory = save_checkpoint(tmp_path_factory.mktemp("ckpt"), family, seed=seed, **overrides)
    theirs, ours = load_both(directory, family, torch.float32)
    assert_same_run(theirs, ours, prompt(rows=1, length=7, seed=seed), new=12)


def test_parameter_names_are_transformers_own(tmp_path: Path):
    directory = save_checkpoint(tmp_path, "qwen3", tie_word_embeddings=True)
    theirs = Qwen3ForCausalLM.from_pretrained(directory)
    ours = QwenDecoder(QwenConfig.from_pretrained(directory))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    state = load_state_dict(directory)
    assert "lm_head.weight" not in state  # tied: the file holds the embedding only
    result = load_into(ours, state)
    assert result.missing == () and result.unexpected == ()
    assert ours.lm_head.weight is ours.model.embed_tokens.weight


def test_to_bfloat16_rounds_inv_freq_like_upstream(tmp_path: Path):
    directory = save_checkpoint(tmp_path, "qwen2")
    theirs = Qwen2ForCausalLM.from_pretrained(directory).eval().to(torch.bfloat16)
    ours = QwenDecoder.from_pretrained(directory).to(torch.bfloat16)
    assert ours.model.rotary_emb.inv_freq.dtype == torch.bfloat16
    ids = prompt()
    with torch.inference_mode():
        assert torch.equal(ours(ids), theirs(ids).logits)


def test_generation_leaves_process_state_alone(tmp_path: Path):
    directory = save_checkpoint(tmp_path, "qwen2")
    ours = QwenDecoder.from_pretrained(directory)
    before = snapshot()
    generate(
        ours,
        prompt(),
        SamplingParams(do_sample=True, top_p=0.9),
        max_new_tokens=4,
        generator=torch.Generator().manual_seed(1),
    )
    assert before.diff(snapshot()) == []


def test_sampling_without_a_generator_or_context_is_refused(tmp_path: Path):
    ours = QwenDecoder.from_pretrained(save_checkpoint(tmp_path, "qwen2"))
    with pytest.raises(ValueError, match="generator"):
        generate(ours, prompt(), SamplingParams(do_sample=True), max_new_tokens=2)


UNSUPPORTED = {
    "model_type": {"model_type": "gemma"},
    "hidden_act": {"hidden_act": "gelu"},
    "use_sliding_window": {"use_sliding_window": True},
    "rope_parameters.rope_type": {"rope_scaling": {"rope_type": "longrope", "factor": 8.0}},
    "rope_parameters.partial_rotary_factor": {"partial_rotary_factor": 0.5},
    "num_key_value_heads": {"num_key_value_heads": 3},
}


@pytest.mark.parametrize("field", sorted(UNSUPPORTED))
def test_unsupported_configs_are_a_typed_error_naming_the_field(tmp_path: Path, field: str):
    raw = {
        "model_type": "qwen2",
        "vocab_size": 32,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        **UNSUPPORTED[field],
    }
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedModel) as raised:
        QwenConfig.from_pretrained(tmp_path)
    assert raised.value.field == field and field in str(raised.value)


def test_config_defaults_follow_transformers(tmp_path: Path):
    base = {"vocab_size": 32, "hidden_size": 64, "num_attention_heads": 4}
    qwen3 = QwenConfig.from_dict({"model_type": "qwen3", **base})
    qwen2 = QwenConfig.from_dict({"model_type": "qwen2", **base})
    assert qwen3.head_dim == 128 and qwen2.head_dim == 16  # Qwen3Config's default is 128
    assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.qk_norm) == (True, False, False)
    assert (qwen3.qkv_bias, qwen3.o_bias, qwen3.qk_norm) == (False, False, True)
    legacy = QwenConfig.from_dict(
        {"model_type": "qwen2", **base, "rope_theta": 5e5, "rope_scaling": {"type": "yarn"}}
    )
    assert legacy.rope.rope_type == "yarn" and legacy.rope.rope_theta == 5e5
    assert legacy.rope.original_max_position_embeddings == 32768
