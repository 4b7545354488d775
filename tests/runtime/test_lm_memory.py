"""peak_bytes: an estimate made from the config alone, checked against the allocator's own peak."""

from __future__ import annotations

import pytest
import torch

from mizuoto_runtime.lm import QwenConfig, QwenDecoder
from mizuoto_runtime.lm.memory import measure_peak_bytes, peak_bytes
from mizuoto_runtime.ops import init_random

SHAPES = {
    "gqa": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "mha-wide-mlp": {
        "hidden_size": 128,
        "intermediate_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
    },
    "mqa-big-heads": {
        "hidden_size": 256,
        "intermediate_size": 704,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
    },
}


def model(family: str, shape: str, dtype: torch.dtype) -> QwenDecoder:
    head_dim = SHAPES[shape]["hidden_size"] // SHAPES[shape]["num_attention_heads"]
    config = QwenConfig.from_dict(
        {
            "model_type": family,
            "vocab_size": 300,
            "num_hidden_layers": 3,
            "head_dim": head_dim,
            **SHAPES[shape],
        }
    )
    decoder = QwenDecoder(config, dtype=dtype)
    init_random(decoder, torch.Generator().manual_seed(0))
    return decoder


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize(
    ("family", "cache", "batch", "seq"),
    [("qwen2", "dynamic", 2, 200), ("qwen3", "static", 1, 64), ("qwen3", "dynamic", 1, 300)],
)
def test_peak_bytes_bounds_the_measured_peak(family, cache, batch, seq, shape, dtype):
    decoder = model(family, shape, dtype)
    ids = torch.randint(0, 300, (batch, seq), generator=torch.Generator().manual_seed(1))
    room = seq + 16

    def prefill():
        with torch.inference_mode():
            kv = decoder.new_cache(cache, batch=batch, max_length=room)
            decoder(ids, kv, logits_to_keep=1)
            return kv

    measured = measure_peak_bytes(prefill)
    estimate = peak_bytes(decoder.config, batch, seq, dtype=dtype, cache=cache, max_length=room)
    assert measured <= estimate <= 1.75 * measured, (measured, estimate)


def test_the_cache_dominates_long_sequences():
    config = model("qwen2", "gqa", torch.float32).config
    short, long = peak_bytes(config, 1, 1000), peak_bytes(config, 1, 2000)
    kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4
    assert long - short >= 1000 * kv_per_token
    assert peak_bytes(config, 1, 100, dtype=torch.bfloat16) < peak_bytes(config, 1, 100)
