"""How much working memory a QwenDecoder needs beyond its weights, before it runs.

``peak_bytes(config, batch, seq)`` bounds the peak of what one prefill of ``seq`` tokens (the
largest step of a generation that ends with ``seq`` tokens in the cache) allocates on top of the
weights: the key/value cache of every layer, the residual stream, and the largest transient of one
layer (the MLP's three [B, L, intermediate] tensors, or RMSNorm's float32 copies, or attention's
projections and RoPE temporaries), plus one position's logits. It is arithmetic on the config, so
a scheduler can ask before loading anything. ``measure_peak_bytes`` measures the same quantity from
the allocator's events (torch.profiler memory events on any device, which record every allocation
and free of torch's allocators), for tests and for calibrating.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mizuoto_runtime.lm.config import QwenConfig

__all__ = ["measure_peak_bytes", "peak_bytes"]


def peak_bytes(
    config: QwenConfig,
    batch: int,
    seq: int,
    *,
    dtype: torch.dtype = torch.float32,
    cache: str = "dynamic",
    max_length: int | None = None,
) -> int:
    """Upper estimate of the bytes a prefill of ``seq`` tokens allocates beyond the weights.

    ``cache="static"`` counts a BufferCache of ``max_length`` (default ``seq``) tokens; a dynamic
    cache reserves room for ``max_length`` tokens too when generate sizes it (default ``seq``).
    """
    item = torch.empty((), dtype=dtype).element_size()
    tokens = batch * seq
    hidden, inner = config.hidden_size, config.intermediate_size
    q_width = config.num_attention_heads * config.head_dim
    kv_width = config.num_key_value_heads * config.head_dim
    held = max(max_length or seq, seq)
    kv_cache = 2 * config.num_hidden_layers * batch * held * kv_width * item

    # RMSNorm over [B, L, width]: x.float() (a copy unless float32), pow, the product, the
    # rounded copy and the weighted output; float32 is 4 bytes whatever the model dtype.
    def norm(width: int) -> int:
        copies = 2 if dtype == torch.float32 else 3
        return tokens * width * (4 * copies + 2 * item)

    # Attention: q, k, v, RoPE's rotated copies and products (about three q-sized tensors at
    # once), keys and values repeated for GQA when a mask forces it, the output and o_proj.
    rope = 3 * tokens * (q_width + kv_width) * item
    repeated = 2 * tokens * q_width * item if config.groups > 1 else 0
    qk_norm = norm(q_width) if config.qk_norm else 0
    attention = (
        tokens * (q_width + 2 * kv_width) * item
        + max(rope, qk_norm)
        + repeated
        + 2 * tokens * q_width * item
        + tokens * hidden * item
    )
    # SwiGLU: gate, silu(gate), up and their product can be alive together, beside the
    # normalised input and the projection's output.
    mlp = 3 * tokens * inner * item + 2 * tokens * hidden * item
    transient = max(norm(hidden), attention, mlp)
    residual = 2 * tokens * hidden * item  # x and x + f(x)
    logits = batch * config.vocab_size * (item + 4)  # one position, and its float32 copy
    return kv_cache + residual + transient + logits


def measure_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes held by torch's allocators during ``fn()``, above what was held before it.

    Read from torch.profiler's memory events (every allocation and free, in order), so it sees
    CPU tensors as well as CUDA ones; memory a library allocates outside torch (oneDNN scratch,
    cuBLAS workspaces) is not counted.
    """
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, profile_memory=True, record_shapes=False) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    held = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        held += event.nbytes()
        peak = max(peak, held)
    return peak
