"""How much working memory a CausalDecoder needs beyond its weights, before it runs.

``peak_bytes(config, batch, seq)`` bounds the peak of what one prefill of ``seq`` tokens (the
largest step of a generation that ends with ``seq`` tokens in the cache) allocates on top of the
weights: the key/value cache of every layer, the residual stream, the largest transient of one
layer, plus one position's logits. It is arithmetic on the config, so a scheduler can ask before
loading anything. ``measure_peak_bytes`` measures the same quantity from the allocator's events
(torch.profiler memory events on any device, which record every allocation and free of torch's
allocators), for tests and for calibrating.

A layer's transient is its largest moment: the tensors alive while one op runs plus what that op
allocates for itself. On CPU the second part depends on the kernels the machine selects, so the
bound takes the most each kind of kernel may allocate through torch's allocator, from the shapes
and the thread count:

- A bfloat16/float16 matmul goes to oneDNN where torch sends it there (x86 with AVX-512; float16
  only with avx512_fp16 or AMX); torch's own kernels elsewhere allocate nothing. A CPU without
  native instructions for the type computes in float32 and converts: an M x N float32 copy of
  the output. One with them (avx512_bf16, avx512_fp16, AMX) runs a blocked kernel that gives every
  thread a packed copy of a K x 64 panel of the weight (64 columns: the widest block its
  microkernels hold in registers), a float32 accumulator for its rows of that panel, and a few
  KiB of descriptors and tile buffers. A matmul runs one kernel or the other: the larger counts.
  float32 matmuls allocate nothing through torch. Measured for bfloat16 (avx512_bf16 and AMX) and
  for float16 without native instructions; float16's native kernels (avx512_fp16, AMX) allocate
  more than this on some shapes, and the estimate does not bound them yet.
- Scaled dot-product attention on CPU runs the flash kernel: every thread gets float32 buffers for
  one block of at most 256 queries x 512 keys (scores, row maxima and sums, the output
  accumulator) and, for half types, a copy of the scores in the model's dtype; float32 log-sum-exp
  values are written for every query. Keys are padded to blocks of 64 where the kernel may pack
  half types (four heads or more, a head size that is a multiple of 64); the packed copies
  themselves are made outside torch's allocator and not counted.

The per-thread parts grow with ``threads`` (default: torch's CPU threads; 0 for a GPU). The
tests measure the bound under each kernel choice the machine can be held to.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mizuoto_runtime.lm.config import DecoderConfig

__all__ = ["measure_peak_bytes", "peak_bytes"]

_PANEL = 64  # columns of a oneDNN blocked-matmul weight panel (and the flash kernel's packing)
_DESCRIPTORS = 4096  # per thread: brgemm batch descriptors and AMX tile buffers
_FLOAT = 4


def _round_up(value: int, block: int) -> int:
    return -(-value // block) * block


def peak_bytes(
    config: DecoderConfig,
    batch: int,
    seq: int,
    *,
    dtype: torch.dtype = torch.float32,
    cache: str = "dynamic",
    max_length: int | None = None,
    threads: int | None = None,
    padded: bool = False,
) -> int:
    """Upper estimate of the bytes a prefill of ``seq`` tokens allocates beyond the weights.

    ``cache="static"`` counts a BufferCache of ``max_length`` (default ``seq``) tokens; a dynamic
    cache reserves room for ``max_length`` tokens too when generate sizes it (default ``seq``).
    ``threads`` is how many CPU threads the kernels run on (default ``torch.get_num_threads()``;
    0 on a GPU, whose kernels keep no per-thread buffers). ``padded`` counts the attention mask
    of a left-padded batch (boolean, and the copy attention makes in the model's dtype).
    """
    threads = torch.get_num_threads() if threads is None else threads
    shape = _Shape(config, batch, seq, dtype, threads, padded)
    held = max(max_length or seq, seq)
    keys = held if cache == "static" else seq  # a static buffer may be attended whole
    kv_cache = 2 * config.num_hidden_layers * batch * held * shape.kv_width * shape.item
    transient = max(shape.norm(config.hidden_size), shape.attention(keys), shape.mlp())
    residual = 2 * shape.tokens * config.hidden_size * shape.item  # x and x + f(x)
    rotary = 3 * shape.tokens * config.head_dim * _FLOAT  # cos, sin, signed sin: every layer's
    mask = shape.tokens * keys if padded else 0
    # One position's logits and their float32 copy, while lm_head's workspace is held.
    logits = batch * config.vocab_size * (shape.item + _FLOAT) + shape.matmul(
        batch, config.hidden_size, config.vocab_size
    )
    return kv_cache + residual + rotary + mask + transient + logits


class _Shape:
    """One prefill's sizes, and the bytes alive at each moment of a layer.

    A block runs with its normalised input ``h`` alive; a moment is what else is alive while
    one op runs, plus that op's own workspace; a block's transient is its largest moment.
    """

    def __init__(
        self,
        config: DecoderConfig,
        batch: int,
        seq: int,
        dtype: torch.dtype,
        threads: int,
        padded: bool,
    ) -> None:
        self.config, self.batch, self.seq, self.dtype = config, batch, seq, dtype
        self.threads, self.padded = threads, padded
        self.item = torch.empty((), dtype=dtype).element_size()
        self.tokens = batch * seq
        self.q_width = config.num_attention_heads * config.head_dim
        self.kv_width = config.num_key_value_heads * config.head_dim
        self.onednn = threads > 0 and _onednn_matmul(dtype)

    def matmul(self, m: int, k: int, n: int) -> int:
        """What an [m, k] x [k, n] matmul allocates for itself (see the module docstring)."""
        if not self.onednn:
            return 0
        columns = min(_round_up(n, 16), _PANEL)
        panel = _round_up(k, _PANEL) * columns * self.item + m * columns * _FLOAT + _DESCRIPTORS
        return max(m * n * _FLOAT, self.threads * panel)  # one kernel or the other, never both

    def norm(self, width: int) -> int:
        # RMSNorm over [B, L, width]: x.float() (a copy unless float32), pow, the product, the
        # rounded copy and the weighted output; float32 is 4 bytes whatever the model dtype.
        copies = 2 if self.dtype == torch.float32 else 3
        return self.tokens * width * (_FLOAT * copies + 2 * self.item)

    def attention(self, keys: int) -> int:
        # The projections; q, k, v with RoPE's products (about three q-sized temporaries) or
        # Qwen3's q/k norms; SDPA's output and the flash kernel's buffers, beside keys and
        # values repeated for GQA when a mask forces it (and the mask's copy); then the output's
        # contiguous copy and o_proj.
        config, tokens, item = self.config, self.tokens, self.item
        hidden = config.hidden_size
        h = tokens * hidden * item
        q, kv = tokens * self.q_width * item, tokens * self.kv_width * item
        rope = 3 * (q + kv)
        repeated = 2 * self.batch * keys * self.q_width * item if config.groups > 1 else 0
        mask_copy = self.tokens * keys * item if self.padded else 0
        heads, dim = config.num_attention_heads, config.head_dim
        flash = _flash(self.batch, heads, self.seq, keys, dim, item, self.threads)
        return h + max(
            q + 2 * kv + self.matmul(tokens, hidden, max(self.q_width, self.kv_width)),
            q + 2 * kv + max(rope, self.norm(self.q_width) if config.qk_norm else 0),
            2 * q + 2 * kv + repeated + mask_copy + flash,
            2 * q + h + self.matmul(tokens, self.q_width, hidden),
        )

    def mlp(self) -> int:
        # SwiGLU: gate, silu(gate), up and their product, at most three [B, L, intermediate] at
        # once; the up and down projections run beside two and one of them, with workspace.
        hidden, inner = self.config.hidden_size, self.config.intermediate_size
        h = self.tokens * hidden * self.item
        wide = self.tokens * inner * self.item
        return h + max(
            3 * wide,
            2 * wide + self.matmul(self.tokens, hidden, inner),
            wide + h + self.matmul(self.tokens, inner, hidden),
        )


def _onednn_matmul(dtype: torch.dtype) -> bool:
    """Whether torch hands CPU matmuls of ``dtype`` to oneDNN (else its own kernels, which keep
    no workspace). Asked of torch, as its matmul asks; when torch cannot say, assume it may."""
    if dtype == torch.float32:
        return False
    check = {
        torch.bfloat16: "_is_mkldnn_bf16_supported",
        torch.float16: "_is_mkldnn_fp16_supported",
    }.get(dtype)
    try:
        supported = bool(getattr(torch.ops.mkldnn, check)()) if check else True
    except (AttributeError, RuntimeError):
        supported = True
    return supported and torch.backends.mkldnn.is_available()


def _flash(
    batch: int, heads: int, queries: int, keys: int, dim: int, item: int, threads: int
) -> int:
    """What CPU flash attention allocates besides its output: per-thread blocks and the LSE."""
    q_block = min(queries, 256 if queries >= 768 else 64 if queries >= 192 else 32)
    kv_block = min(keys, 512)
    if item != _FLOAT and heads >= 4 and dim % _PANEL == 0 and keys >= _PANEL:
        kv_block = _round_up(kv_block, _PANEL)  # half types may be packed in blocks of 64
    per_thread = (q_block * kv_block + 2 * q_block + q_block * dim) * _FLOAT
    if item != _FLOAT:
        per_thread += q_block * (kv_block + 1) * item  # the scores in the model's dtype
    return threads * per_thread + batch * heads * queries * _FLOAT


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
