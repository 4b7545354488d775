"""Caches: BufferCache against transformers' StaticCache, DynamicCache against DynamicCache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import DynamicCache as UpstreamDynamicCache
from transformers import Qwen2ForCausalLM, Qwen3ForCausalLM, StaticCache

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.lm import BufferCache, CacheFull, DynamicCache, QwenDecoder, generate, mask_for
from mizuoto_runtime.sampling import SamplingParams

VOCAB = 97
PAD = 0
MODELS = {"qwen2": Qwen2ForCausalLM, "qwen3": Qwen3ForCausalLM}


def checkpoint(directory: Path, family: str, **overrides: object) -> Path:
    from transformers import Qwen2Config, Qwen3Config

    fields: dict[str, object] = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        **overrides,
    }
    config = Qwen3Config(head_dim=16, **fields) if family == "qwen3" else Qwen2Config(**fields)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        MODELS[family](config).save_pretrained(directory)
    return directory


def prompt(rows: int = 2, length: int = 9) -> torch.Tensor:
    return torch.randint(1, VOCAB, (rows, length), generator=torch.Generator().manual_seed(1))


def upstream(model, ids: torch.Tensor, cache, seed: int = 0, **kwargs):
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        return model.generate(
            ids,
            cache=cache,
            disable_compile=True,
            return_dict_in_generate=True,
            output_logits=True,
            pad_token_id=PAD,
            **kwargs,
        )


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    ("family", "kv_heads"), [("qwen2", 2), ("qwen3", 1), ("qwen3", 4)], ids=["q2", "q3-mqa", "q3"]
)
def test_buffer_cache_equals_static_cache(
    tmp_path: Path, family: str, kv_heads: int, dtype: torch.dtype, padded: bool
):
    directory = checkpoint(tmp_path, family, num_key_value_heads=kv_heads)
    theirs = MODELS[family].from_pretrained(directory, dtype=dtype).eval()
    ours = QwenDecoder.from_pretrained(directory, dtype=dtype)
    ids, new = prompt(), 10
    mask = torch.ones_like(ids)
    if padded:
        ids[1, :4], mask[1, :4] = PAD, 0
    length = ids.shape[1] + new - 1  # what generate sizes its static cache to
    sampling = {"do_sample": True, "top_k": 12}
    out = upstream(
        theirs,
        ids,
        StaticCache(config=theirs.config, max_cache_len=length),
        seed=5,
        attention_mask=mask,
        max_new_tokens=new,
        **sampling,
    )
    ctx = RequestContext(seed=5, settings={"compute.kv_cache": "static"})
    with ctx.bind():
        result = generate(
            ours,
            ids,
            SamplingParams(**sampling),
            max_new_tokens=new,
            padding_mask=mask,
            pad_token_id=PAD,
            output_logits=True,
        )
    assert ctx.applied["kv_cache"] == "static"
    assert all(torch.equal(a, b) for a, b in zip(result.logits, out.logits, strict=True))
    assert torch.equal(result.tokens, out.sequences)


def test_dynamic_cache_holds_upstreams_keys_and_values(tmp_path: Path):
    directory = checkpoint(tmp_path, "qwen3")
    theirs = Qwen3ForCausalLM.from_pretrained(directory).eval()
    ours = QwenDecoder.from_pretrained(directory)
    ids = prompt()
    reference = UpstreamDynamicCache(config=theirs.config)
    upstream(theirs, ids, reference, max_new_tokens=20)
    cache = ours.new_cache("dynamic")  # no room reserved: it grows by doubling
    generate(ours, ids, max_new_tokens=20, cache=cache)
    assert cache.length == reference.get_seq_length() == ids.shape[1] + 19
    for layer, (keys, values) in enumerate(zip(cache.keys, cache.values, strict=True)):
        assert torch.equal(keys, reference.layers[layer].keys)  # post-norm, post-RoPE, [B, KV]
        assert torch.equal(values, reference.layers[layer].values)


def test_a_full_buffer_cache_says_how_to_fix_it(tmp_path: Path):
    ours = QwenDecoder.from_pretrained(checkpoint(tmp_path, "qwen2"))
    cache = ours.new_cache("static", batch=2, max_length=10)
    with pytest.raises(CacheFull, match="larger max_length"):
        generate(ours, prompt(), max_new_tokens=4, cache=cache)


def test_reset_buffer_cache_reproduces_the_first_run(tmp_path: Path):
    ours = QwenDecoder.from_pretrained(checkpoint(tmp_path, "qwen2"))
    cache = ours.new_cache("static", batch=2, max_length=24)
    keys = cache.keys[0]
    first = generate(ours, prompt(), max_new_tokens=8, cache=cache).tokens
    cache.reset()
    assert cache.length == 0 and int(cache.position) == 0
    assert torch.equal(generate(ours, prompt(), max_new_tokens=8, cache=cache).tokens, first)
    assert cache.keys[0] is keys  # same buffers: what a captured graph needs


def test_caches_report_what_they_hold(tmp_path: Path):
    ours = QwenDecoder.from_pretrained(checkpoint(tmp_path, "qwen2"))
    dynamic, static = ours.new_cache("dynamic"), ours.new_cache("static", batch=2, max_length=16)
    assert isinstance(dynamic, DynamicCache) and isinstance(static, BufferCache)
    with torch.inference_mode():
        ours(prompt(), dynamic)
        ours(prompt(), static)
    assert dynamic.length == static.length == int(static.position) == 9
    assert static.keys[0].shape == (2, 2, 16, 16)
    with pytest.raises(ValueError, match="'dynamic' or 'static'"):
        ours.new_cache("paged")


def test_mask_for_matches_upstream_skips_and_shapes():
    # no padding: None for prefill and decode of a dynamic cache, and for a static prefill
    assert mask_for(2, 5, 5) is None
    assert mask_for(2, 1, 9, 8) is None
    assert mask_for(2, 5, 16, torch.tensor(0), static=True) is None
    decode = mask_for(2, 1, 16, torch.tensor(8), static=True)
    assert decode.shape == (2, 1, 1, 16) and decode.is_contiguous()
    assert decode[0, 0, 0].tolist() == [True] * 9 + [False] * 7
    padding = torch.tensor([[1, 1, 1], [0, 1, 1]])
    padded = mask_for(2, 3, 3, 0, padding)
    assert padded[1, 0].tolist() == [
        [False, False, False],
        [False, True, False],
        [False, True, True],
    ]
