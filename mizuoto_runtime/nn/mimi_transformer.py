"""Mimi's transformer (transformers 5.24's ``MimiTransformerModel``): pre-norm LayerNorm layers,
RoPE, GELU MLP and layer scale, causal attention over a sliding window, through ``accel.attention``.

The whole-sequence call reproduces what transformers' sdpa path runs: no mask and ``is_causal``
while the sequence is shorter than the window, a boolean window mask (and keys repeated per
query head) once it is not. A ``Cache`` lets a stream feed frames chunk by chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_runtime.accel import Site, attention
from mizuoto_runtime.ops import default
from mizuoto_sdk.errors import EngineUnavailable

__all__ = ["Cache", "Transformer", "TransformerSettings"]

SITE = Site("mimi.self_attention", upstream="transformers 5.24 sdpa_attention_forward")

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class TransformerSettings:
    """The config fields the transformer reads, each with upstream's default."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.hidden = int(config.get("hidden_size", 512))
        self.layers = int(config.get("num_hidden_layers", 8))
        self.intermediate = int(config.get("intermediate_size", 2048))
        self.heads = int(config.get("num_attention_heads", 8))
        self.kv_heads = int(config.get("num_key_value_heads", self.heads))
        self.head_dim = int(config.get("head_dim") or self.hidden // self.heads)
        self.eps = float(config.get("norm_eps", 1e-5))
        self.window = config.get("sliding_window", 250)
        self.bias = bool(config.get("attention_bias", False))
        activation = config.get("hidden_act", "gelu")
        if activation not in _ACTIVATIONS:
            raise EngineUnavailable(
                f"mimi: config hidden_act={activation!r} is not supported; "
                f"supported: {', '.join(_ACTIVATIONS)}"
            )
        self.activation = _ACTIVATIONS[activation]
        rope = config.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default" or config.get("rope_scaling"):
            raise EngineUnavailable(
                f"mimi: config rope_parameters={rope!r} is not supported (default RoPE only)"
            )
        self.rope_theta = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))


class Cache:
    """One stream's keys and values per layer (after RoPE) and how many frames it has seen."""

    def __init__(self, layers: int) -> None:
        self.keys: list[Tensor | None] = [None] * layers
        self.values: list[Tensor | None] = [None] * layers
        self.seen = 0


class _Attention(nn.Module):
    def __init__(self, s: TransformerSettings) -> None:
        super().__init__()
        self.q_proj = default.Linear(s.hidden, s.heads * s.head_dim, bias=s.bias)
        self.k_proj = default.Linear(s.hidden, s.kv_heads * s.head_dim, bias=s.bias)
        self.v_proj = default.Linear(s.hidden, s.kv_heads * s.head_dim, bias=s.bias)
        self.o_proj = default.Linear(s.heads * s.head_dim, s.hidden, bias=s.bias)
        self.head_dim = s.head_dim
        self.groups = s.heads // s.kv_heads
        self.window = s.window

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor], cache: Cache | None, index: int
    ) -> Tensor:
        batch, length, _ = x.shape
        shape = (batch, length, -1, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)  # [B, H, T, hd]
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = rope[0][:, None], rope[1][:, None]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        past = 0
        if cache is not None:
            past = cache.seen
            old_k, old_v = cache.keys[index], cache.values[index]
            if old_k is not None and old_v is not None:
                k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
            keep = k.shape[2] if self.window is None else min(k.shape[2], int(self.window))
            cache.keys[index], cache.values[index] = k[:, :, -keep:], v[:, :, -keep:]
        out = self._attend(q, k, v, past)
        return self.o_proj(out.transpose(1, 2).contiguous().reshape(batch, length, -1))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, past: int) -> Tensor:
        queries, keys = q.shape[2], k.shape[2]
        window = None if self.window is None else int(self.window)
        mask: Tensor | None = None
        if (window is not None and keys >= window) or queries != keys:
            # transformers keeps the mask only then; otherwise sdpa's own causal flag does
            query_at = torch.arange(past, past + queries, device=q.device)[:, None]
            key_at = torch.arange(past + queries - keys, past + queries, device=q.device)[None, :]
            allowed = key_at <= query_at
            if window is not None:
                allowed = allowed & (key_at > query_at - window)
            mask = allowed.expand(q.shape[0], 1, queries, keys)
        causal = mask is None and queries > 1
        scale = 1 / math.sqrt(self.head_dim)
        if self.groups == 1:
            return attention(q, k, v, site=SITE, mask=mask, causal=causal, scale=scale)
        if mask is None and k.shape[-1] <= 256:
            return attention(q, k, v, site=SITE, causal=causal, scale=scale, enable_gqa=True)
        if queries == 1:
            b, h, _, d = q.shape  # transformers' pack_gqa: one query row per repeated head
            packed = q.reshape(b, h // self.groups, self.groups, d)
            out = attention(packed, k, v, site=SITE, mask=mask, scale=scale)
            return out.reshape(b, h, 1, d)
        k, v = _repeat_kv(k, self.groups), _repeat_kv(v, self.groups)
        return attention(q, k, v, site=SITE, mask=mask, causal=causal, scale=scale)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, groups, t, d).reshape(b, h * groups, t, d)


class _MLP(nn.Module):
    def __init__(self, s: TransformerSettings) -> None:
        super().__init__()
        self.fc1 = default.Linear(s.hidden, s.intermediate, bias=False)
        self.fc2 = default.Linear(s.intermediate, s.hidden, bias=False)
        self.activation = s.activation

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.activation(self.fc1(x)))


class _LayerScale(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.empty(channels))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


class _Layer(nn.Module):
    def __init__(self, s: TransformerSettings) -> None:
        super().__init__()
        self.self_attn = _Attention(s)
        self.mlp = _MLP(s)
        self.input_layernorm = default.LayerNorm(s.hidden, eps=s.eps)
        self.post_attention_layernorm = default.LayerNorm(s.hidden, eps=s.eps)
        self.self_attn_layer_scale = _LayerScale(s.hidden)
        self.mlp_layer_scale = _LayerScale(s.hidden)

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor], cache: Cache | None, index: int
    ) -> Tensor:
        x = x + self.self_attn_layer_scale(
            self.self_attn(self.input_layernorm(x), rope, cache, index)
        )
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class Transformer(nn.Module):
    """[B, T, hidden] -> [B, T, hidden]; with ``cache``, T frames after those it has seen."""

    def __init__(self, s: TransformerSettings) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Layer(s) for _ in range(s.layers)])
        # upstream's inv_freq, float32 on the CPU whatever the model's dtype; not a buffer, so
        # that casting the module leaves it alone
        exponents = torch.arange(0, s.head_dim, 2, dtype=torch.float, device="cpu") / s.head_dim
        self._inv_freq = 1.0 / (s.rope_theta**exponents)

    def forward(self, x: Tensor, cache: Cache | None = None) -> Tensor:
        past = 0 if cache is None else cache.seen
        positions = torch.arange(past, past + x.shape[1], device=x.device)[None]
        freqs = positions[..., None].float() * self._inv_freq.to(x.device)
        angles = torch.cat((freqs, freqs), dim=-1)
        rope = ((angles.cos() * 1.0).to(x.dtype), (angles.sin() * 1.0).to(x.dtype))
        for index, layer in enumerate(self.layers):
            x = layer(x, rope, cache, index)
        if cache is not None:
            cache.seen += x.shape[1]
        return x
