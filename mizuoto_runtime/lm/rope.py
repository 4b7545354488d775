"""Rotary position embeddings, computed with transformers 5.24's own ops in its own order.

Each ``*_frequencies`` function is upstream's ``modeling_rope_utils`` initialiser for one rope
type, kept op for op (python floats where upstream uses python floats, float32 tensors where it
uses tensors), because RoPE frequencies feed every layer and one ulp in ``inv_freq`` changes the
logits. ``inv_freq`` is built on the CPU in float32 at construction, as upstream does, and is a
non-persistent buffer: ``module.to(torch.bfloat16)`` rounds it exactly as upstream's ``.to()``
does, while building the decoder in bfloat16 keeps it in float32 like ``from_pretrained(dtype=)``.

Dynamic NTK recomputes the frequencies once positions pass ``max_position_embeddings``. Upstream
keeps that state on the model, so one long request changes the next; here it lives in the request's
cache (``RopeState``), which equals upstream on a freshly loaded model and keeps requests
independent.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from mizuoto_runtime.lm.config import DecoderConfig, UnsupportedModel

__all__ = [
    "RopeState",
    "Rotary",
    "RotaryEmbedding",
    "apply_rotary",
    "inv_frequencies",
    "rotate_half",
]


def _factor(config: DecoderConfig) -> float:
    factor = config.rope.factor
    if factor is None:  # from_dict requires one for linear and dynamic RoPE
        raise UnsupportedModel(
            "rope_parameters.factor", f"{config.rope.rope_type} RoPE needs a number, got None"
        )
    return factor


def _default(config: DecoderConfig) -> tuple[Tensor, float]:
    base, dim = config.rope.rope_theta, config.head_dim
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    return inv_freq, 1.0


def _linear(config: DecoderConfig) -> tuple[Tensor, float]:
    base, dim = config.rope.rope_theta, config.head_dim
    steps = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float)
    inv_freq = 1.0 / (base ** (steps / dim))
    inv_freq /= _factor(config)
    return inv_freq, 1.0


def _dynamic(
    config: DecoderConfig, seq_len: int | Tensor | None = None, device: torch.device | None = None
) -> tuple[Tensor, float]:
    base, dim, factor = config.rope.rope_theta, config.head_dim, _factor(config)
    longest = config.max_position_embeddings
    length: int | Tensor
    if seq_len is None:
        length = longest
    elif isinstance(seq_len, Tensor):  # the growth path: float32 tensor arithmetic, as upstream
        length = torch.maximum(
            seq_len, torch.tensor(longest, dtype=seq_len.dtype, device=seq_len.device)
        )
    else:
        length = max(seq_len, longest)
    scaled = base * ((factor * length / longest) - (factor - 1)) ** (dim / (dim - 2))
    steps = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float)
    return 1.0 / (scaled ** (steps / dim)), 1.0


def _yarn(config: DecoderConfig) -> tuple[Tensor, float]:
    rope = config.rope
    base, dim = rope.rope_theta, config.head_dim
    original = rope.original_max_position_embeddings
    if original is None:  # from_dict always sets it for yarn
        raise UnsupportedModel(
            "rope_parameters.original_max_position_embeddings", "yarn RoPE needs it, got None"
        )
    factor = rope.factor
    if factor is None:
        factor = config.max_position_embeddings / original

    def get_mscale(scale: float, mscale: float = 1) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = float(
                get_mscale(factor, rope.mscale) / get_mscale(factor, rope.mscale_all_dim)
            )
        else:
            attention_factor = get_mscale(factor)
    beta_fast = rope.beta_fast or 32
    beta_slow = rope.beta_slow or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # upstream's guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)

    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp.to(dtype=torch.float)
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, attention_factor


def _llama3(config: DecoderConfig) -> tuple[Tensor, float]:
    # Llama 3.1: long wavelengths divided by factor, short ones kept, a smooth ramp between.
    rope = config.rope
    base, dim = rope.rope_theta, config.head_dim
    factor, low, high = _factor(config), rope.low_freq_factor, rope.high_freq_factor
    original = rope.original_max_position_embeddings
    if low is None or high is None or original is None:  # from_dict always sets them for llama3
        raise UnsupportedModel(
            "rope_parameters.low_freq_factor",
            "llama3 RoPE needs low_freq_factor, high_freq_factor and "
            "original_max_position_embeddings",
        )
    steps = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float)
    inv_freq = 1.0 / (base ** (steps / dim))
    low_wavelength, high_wavelength = original / low, original / high
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > low_wavelength, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < high_wavelength) * ~(wavelength > low_wavelength)
    return torch.where(medium, smoothed, scaled), 1.0


def inv_frequencies(config: DecoderConfig) -> tuple[Tensor, float]:
    """``(inv_freq [head_dim / 2] float32 on CPU, attention_scaling)`` at construction time."""
    kind = config.rope.rope_type
    if kind == "linear":
        return _linear(config)
    if kind == "dynamic":
        return _dynamic(config)
    if kind == "yarn":
        return _yarn(config)
    if kind == "llama3":
        return _llama3(config)
    return _default(config)


class RopeState:
    """RoPE of one request, kept with its cache: dynamic NTK's frequencies (upstream's
    ``max_seq_len_cached`` bookkeeping), or a table of cos/sin for the positions it will hold."""

    def __init__(self, original: int, table: Rotary | None = None) -> None:
        self.original = original
        self.longest = original
        self.inv_freq: Tensor | None = None  # None: the module's own (original) frequencies
        self.table = table

    def rows(self, start: int, length: int) -> Rotary | None:
        """The table's rows for positions ``start ..`` (None: no table, or it is too short)."""
        if self.table is None or start + length > self.table.cos.shape[1]:
            return None
        return self.table.at(start, length)


def rotate_half(x: Tensor) -> Tensor:
    """Upstream's ``cat(-x2, x1)``; ``apply_rotary`` gets the same products another way."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rotary(NamedTuple):
    """cos and sin [B or 1, L, D] of one forward, sin with its first half negated.

    Upstream multiplies ``rotate_half(q) = cat(-q2, q1)`` by ``sin``; ``roll(q, D/2) = cat(q2, q1)``
    times ``cat(-s1, s2)`` gives every product bit for bit (negation is exact and commutes with
    rounding), in one kernel fewer per tensor, with the negation done once per forward.
    """

    cos: Tensor
    signed_sin: Tensor

    @classmethod
    def of(cls, cos: Tensor, sin: Tensor) -> Rotary:
        half = sin.shape[-1] // 2
        return cls(cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1))

    def at(self, start: int, length: int) -> Rotary:
        """The rows of positions ``start ..`` of a table built for positions 0 .. S."""
        return Rotary(
            self.cos[:, start : start + length], self.signed_sin[:, start : start + length]
        )

    def gather(self, positions: Tensor) -> Rotary:
        """Rows of a table [1, S, D] at ``positions`` [B, L] (left-padded rows)."""
        return Rotary(self.cos[0][positions], self.signed_sin[0][positions])


def apply_rotary(q: Tensor, k: Tensor, rotary: Rotary) -> tuple[Tensor, Tensor]:
    # q [B, H, L, D], k [B, KV, L, D]; cos/sin [B, L, D] broadcast over heads
    cos, sin = rotary.cos.unsqueeze(1), rotary.signed_sin.unsqueeze(1)
    half = q.shape[-1] // 2
    q_embed = (q * cos) + (torch.roll(q, half, dims=-1) * sin)
    k_embed = (k * cos) + (torch.roll(k, half, dims=-1) * sin)
    return q_embed, k_embed


class RotaryEmbedding(nn.Module):
    """Model-level cos/sin, computed once per forward and shared by every layer."""

    inv_freq: Tensor

    def __init__(self, config: DecoderConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = config
        # Computed on the CPU even under ``with torch.device("meta")`` (how decoders are built
        # before loading): on meta, llama3's and yarn's arithmetic goes through torch's
        # reference ops, which import torch._dynamo; the decoder replaces this one once loaded.
        with torch.device("cpu"):
            inv_freq, self.attention_scaling = inv_frequencies(config)
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)

    def frequencies(self, positions: Tensor, state: RopeState, seen: int) -> Tensor:
        """The inverse frequencies for this forward; dynamic NTK may grow them.

        ``seen`` is the largest position + 1 in ``positions``, known on the host, so deciding
        whether to grow never waits for the device.
        """
        if self.config.rope.rope_type != "dynamic":
            return self.inv_freq
        if seen > state.longest:  # growth: upstream passes max(position_ids) + 1 as a tensor
            seq_len = torch.tensor(seen, dtype=torch.int64, device=positions.device)
            state.inv_freq, _ = _dynamic(self.config, seq_len, positions.device)
            state.longest = seen
        if seen < state.original and state.longest > state.original:  # back to the original
            state.inv_freq, state.longest = None, state.original
        return self.inv_freq if state.inv_freq is None else state.inv_freq

    def table(self, length: int, dtype: torch.dtype) -> Rotary | None:
        """cos/sin of positions 0 .. length - 1 [1, length, D], for a decode loop to slice.

        Each row equals what a forward computes for that position alone: the same products, and
        ATen's cos/sin apply one vectorised routine to every element whatever the tensor's size
        (the parity tests hold this to upstream's bits). A small model's decode step then skips
        RoPE's kernels. None for dynamic NTK, whose frequencies change with the length.
        """
        if self.config.rope.rope_type == "dynamic":
            return None
        like = torch.empty(0, dtype=dtype, device=self.inv_freq.device)
        positions = torch.arange(length, device=self.inv_freq.device)[None]
        with torch.inference_mode():
            return Rotary.of(*self(like, positions))

    def forward(
        self, x: Tensor, positions: Tensor, inv_freq: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        # positions [B, L] -> cos, sin [B, L, head_dim] in x's dtype
        inv_freq = self.inv_freq if inv_freq is None else inv_freq
        freqs = positions[..., None].float() * inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.attention_scaling != 1.0:  # x * 1.0 == x, so skipping it keeps the bits
            cos, sin = cos * self.attention_scaling, sin * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)
