"""peak_bytes: an estimate made from the config alone, checked against the allocator's own peak.

What CPU kernels allocate for themselves depends on the machine (oneDNN's bfloat16/float16 matmuls
keep per-thread panels where the CPU has native instructions, a float32 copy of the output where
it has not; the flash attention kernel keeps per-thread blocks), so the bound is checked under
every kernel choice this machine can be made to take, and its tightness on the part that does
not depend on them. One choice it cannot be made to take: where the CPU has native float16
instructions (avx512_fp16, AMX), torch sends float16 matmuls to oneDNN's native kernels whatever
ONEDNN_MAX_CPU_ISA says, and their workspace is not what the estimate models (measured above it
on such a CPU); float16 is checked only on CPUs without them, and skipped elsewhere with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _native_float16_matmuls() -> bool:
    """Whether torch sends float16 CPU matmuls to oneDNN's native kernels: its own check, made on
    the CPU's features (when torch cannot say, assume it does)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):
        return True


# What this CPU runs that the estimate does not model, by dtype: those checks skip, saying why.
UNMODELLED = (
    {
        "fp16": "float16 matmuls run oneDNN's native float16 kernels on this CPU (avx512_fp16 or "
        "AMX), whose workspace peak_bytes does not model"
    }
    if _native_float16_matmuls()
    else {}
)


def skip_unmodelled(dtype: str) -> None:
    if dtype in UNMODELLED:
        pytest.skip(UNMODELLED[dtype])


def model(family: str, shape: str, dtype: torch.dtype) -> QwenDecoder:
    head_dim = SHAPES[shape]["hidden_size"] // SHAPES[shape]["num_attention_heads"]
    config = QwenConfig.from_dict(
        {
            "model_type": family,
            "vocab_size": 300,
            "num_hidden_layers": 3,
            "head_dim": head_dim,
            **SHAPES[shape],
            **({"attention_bias": True, "mlp_bias": True} if family == "llama" else {}),
        }
    )
    decoder = QwenDecoder(config, dtype=dtype)
    init_random(decoder, torch.Generator().manual_seed(0))
    return decoder


def measure(
    family: str, cache: str, batch: int, seq: int, shape: str, dtype: str, padded: bool = False
) -> tuple[int, dict[str, object]]:
    """The measured peak of one prefill, and the keyword arguments that describe it."""
    decoder = model(family, shape, DTYPES[dtype])
    ids = torch.randint(0, 300, (batch, seq), generator=torch.Generator().manual_seed(1))
    padding = torch.ones(batch, seq, dtype=torch.long)
    padding[0, : seq // 3] = 0  # the first row is left-padded

    def prefill():
        with torch.inference_mode():
            kv = decoder.new_cache(cache, batch=batch, max_length=seq + 16)
            decoder(ids, kv, logits_to_keep=1, padding_mask=padding if padded else None)
            return kv

    described = {
        "config": decoder.config,
        "batch": batch,
        "seq": seq,
        "dtype": DTYPES[dtype],
        "cache": cache,
        "max_length": seq + 16,
        "padded": padded,
    }
    return measure_peak_bytes(prefill), described


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize(
    ("family", "cache", "batch", "seq"),
    [
        ("qwen2", "dynamic", 2, 200),
        ("qwen3", "static", 1, 64),
        ("qwen3", "dynamic", 1, 300),
        ("llama", "static", 2, 120),
    ],
)
def test_peak_bytes_bounds_the_measured_peak(family, cache, batch, seq, shape, dtype):
    skip_unmodelled(dtype)
    measured, described = measure(family, cache, batch, seq, shape, dtype)
    estimate = peak_bytes(**described)
    assert measured <= estimate, (measured, estimate)
    # Without the kernels' own workspace (threads=0), what remains is allocated on any machine.
    assert peak_bytes(**described, threads=0) <= 1.75 * measured, (measured, estimate)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_padded_batch_counts_its_mask(dtype):
    measured, described = measure("qwen3", "static", 3, 64, "gqa", dtype, padded=True)
    assert measured <= peak_bytes(**described)


# Each run: (family, cache, batch, seq, shape, dtype) under 1 and 5 threads, in a fresh process
# whose oneDNN is held to one instruction set (ignored where the CPU lacks it, or is not x86);
# the unmodelled kernels above are left out.
PROBES = [
    ("qwen3", "static", 1, 64, "mha-wide-mlp", "bf16"),
    ("qwen2", "dynamic", 2, 200, "gqa", "bf16"),
    ("qwen3", "dynamic", 1, 300, "mqa-big-heads", "fp16"),
]


@pytest.mark.parametrize("isa", ["AVX512_CORE", "ALL"])  # emulated and native bfloat16
def test_the_bound_holds_whichever_kernels_the_cpu_selects(isa):
    probes = [probe for probe in PROBES if probe[-1] not in UNMODELLED]
    done = subprocess.run(
        [sys.executable, __file__, json.dumps(probes)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "ONEDNN_MAX_CPU_ISA": isa},
    )
    assert done.returncode == 0, done.stderr
    for probe, threads, measured, estimate in json.loads(done.stdout.splitlines()[-1]):
        assert measured <= estimate, (isa, probe, threads, measured, estimate)


def test_the_cache_dominates_long_sequences():
    config = model("qwen2", "gqa", torch.float32).config
    short, long = peak_bytes(config, 1, 1000), peak_bytes(config, 1, 2000)
    kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4
    assert long - short >= 1000 * kv_per_token
    full, half = (
        peak_bytes(config, 1, 100, dtype=d, threads=0) for d in (torch.float32, torch.bfloat16)
    )
    assert half < full  # activations; the kernels' workspace grows with threads instead


def _probe(probes: list[list[object]]) -> list[list[object]]:
    """Run in a fresh process by the test above: threads are process-wide, so set them here."""
    rows = []
    for threads in (1, 5):
        torch.set_num_threads(threads)
        for probe in probes:
            measured, described = measure(*probe)
            rows.append([probe, threads, measured, peak_bytes(**described)])
    return rows


if __name__ == "__main__":
    print(json.dumps(_probe(json.loads(sys.argv[1]))))
