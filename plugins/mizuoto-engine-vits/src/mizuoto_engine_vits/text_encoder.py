"""VITS's text encoder: ids -> hidden states and the prior's means and log-variances per id.

A post-norm Transformer encoder whose self-attention adds relative-position terms (Shaw et al.
2018, windowed as in VITS: ``window_size`` positions each way, learned key and value tables),
and whose feed-forward block is two 1-D convolutions over time. Parameter names are
transformers' ``VitsTextEncoder``'s; the ops are its ops in its order (the padding masks stay,
as ones, because a multiply by them also makes a view contiguous before the next conv), so
float32 on the CPU equals it bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_engine_vits.config import VitsConfig
from mizuoto_runtime.ops import default


class VitsAttention(nn.Module):
    """Multi-head self-attention with windowed relative-position keys and values (upstream 5.x
    requires a window: ``window_size`` is a positive integer)."""

    def __init__(self, config: VitsConfig, **factory: Any) -> None:
        super().__init__()
        self.embed_dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = self.embed_dim // self.num_heads
        self.scaling = self.head_dim**-0.5
        self.window_size = config.window_size
        bias = config.use_bias
        self.k_proj = default.Linear(self.embed_dim, self.embed_dim, bias=bias, **factory)
        self.v_proj = default.Linear(self.embed_dim, self.embed_dim, bias=bias, **factory)
        self.q_proj = default.Linear(self.embed_dim, self.embed_dim, bias=bias, **factory)
        self.out_proj = default.Linear(self.embed_dim, self.embed_dim, bias=bias, **factory)
        table = (1, 2 * self.window_size + 1, self.head_dim)
        self.emb_rel_k = nn.Parameter(torch.empty(table, **factory))
        self.emb_rel_v = nn.Parameter(torch.empty(table, **factory))

    def _heads(self, x: Tensor, batch: int) -> Tensor:
        return x.view(batch, -1, self.num_heads, self.head_dim).transpose(1, 2).contiguous()

    def forward(self, hidden: Tensor) -> Tensor:
        batch, length, _ = hidden.shape
        flat = (batch * self.num_heads, -1, self.head_dim)
        query = self._heads(self.q_proj(hidden) * self.scaling, batch).view(*flat)
        key = self._heads(self.k_proj(hidden), batch).view(*flat)
        value = self._heads(self.v_proj(hidden), batch).view(*flat)
        weights = torch.bmm(query, key.transpose(1, 2))  # [B * heads, T, T]
        keys = self._relative_table(self.emb_rel_k, length)  # [1, 2T - 1, head_dim]
        weights += _relative_to_absolute(torch.matmul(query, keys.transpose(-2, -1)))
        probs = F.softmax(weights, dim=-1)
        out = torch.bmm(probs, value)
        values = self._relative_table(self.emb_rel_v, length)
        out += torch.matmul(_absolute_to_relative(probs), values)
        out = out.view(batch, self.num_heads, length, self.head_dim).transpose(1, 2)
        return self.out_proj(out.reshape(batch, length, self.embed_dim))

    def _relative_table(self, table: Tensor, length: int) -> Tensor:
        """The rows for offsets -(length - 1) .. length - 1: zero-padded past the window."""
        window = self.window_size
        pad = max(length - (window + 1), 0)
        if pad > 0:
            table = F.pad(table, [0, 0, pad, pad, 0, 0])
        start = max((window + 1) - length, 0)
        return table[:, start : start + 2 * length - 1]


def _relative_to_absolute(x: Tensor) -> Tensor:
    """[BH, T, 2T - 1] logits by offset -> [BH, T, T] by key position (the pad-and-reshape skew)."""
    heads, length, _ = x.shape
    x = F.pad(x, [0, 1, 0, 0, 0, 0]).view([heads, length * 2 * length])
    x = F.pad(x, [0, length - 1, 0, 0]).view([heads, length + 1, 2 * length - 1])
    return x[:, :length, length - 1 :]


def _absolute_to_relative(x: Tensor) -> Tensor:
    """[BH, T, T] weights by key position -> [BH, T, 2T - 1] by offset (the inverse skew)."""
    heads, length, _ = x.shape
    x = F.pad(x, [0, length - 1, 0, 0, 0, 0]).view([heads, length * (2 * length - 1)])
    x = F.pad(x, [length, 0, 0, 0])
    return x.view([heads, length, 2 * length])[:, :, 1:]


class VitsFeedForward(nn.Module):
    """Two convolutions over time with the activation between, padded to keep the length."""

    def __init__(self, config: VitsConfig, **factory: Any) -> None:
        super().__init__()
        k = config.ffn_kernel_size
        self.conv_1 = default.Conv1d(config.hidden_size, config.ffn_dim, k, **factory)
        self.conv_2 = default.Conv1d(config.ffn_dim, config.hidden_size, k, **factory)
        self.activation = F.relu if config.hidden_act == "relu" else F.gelu
        self.padding = [(k - 1) // 2, k // 2, 0, 0, 0, 0] if k > 1 else None

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        hidden = hidden.permute(0, 2, 1) * mask  # [B, C, T]
        if self.padding is not None:
            hidden = F.pad(hidden, self.padding)
        hidden = self.activation(self.conv_1(hidden)) * mask
        if self.padding is not None:
            hidden = F.pad(hidden, self.padding)
        return (self.conv_2(hidden) * mask).permute(0, 2, 1)


class VitsEncoderLayer(nn.Module):
    def __init__(self, config: VitsConfig, **factory: Any) -> None:
        super().__init__()
        eps = config.layer_norm_eps
        self.attention = VitsAttention(config, **factory)
        self.layer_norm = default.LayerNorm(config.hidden_size, eps=eps, **factory)
        self.feed_forward = VitsFeedForward(config, **factory)
        self.final_layer_norm = default.LayerNorm(config.hidden_size, eps=eps, **factory)

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        hidden = self.layer_norm(hidden + self.attention(hidden))
        return self.final_layer_norm(hidden + self.feed_forward(hidden, mask))


class VitsEncoder(nn.Module):
    def __init__(self, config: VitsConfig, **factory: Any) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            VitsEncoderLayer(config, **factory) for _ in range(config.num_hidden_layers)
        )


class VitsTextEncoder(nn.Module):
    """``ids [B, T]`` -> hidden ``[B, T, hidden]``, the prior's means and log-variances
    ``[B, T, flow]``."""

    def __init__(self, config: VitsConfig, **factory: Any) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = default.Embedding(config.vocab_size, config.hidden_size, **factory)
        self.encoder = VitsEncoder(config, **factory)
        self.project = default.Conv1d(config.hidden_size, config.flow_size * 2, 1, **factory)

    def forward(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``mask`` is the padding mask ``[B, T, 1]`` (ones for one unpadded text)."""
        hidden = self.embed_tokens(ids) * math.sqrt(self.config.hidden_size)
        hidden = hidden * mask
        time_mask = mask.permute(0, 2, 1)  # [B, 1, T]
        for layer in self.encoder.layers:
            hidden = layer(hidden, time_mask)
        hidden = hidden * mask
        stats = self.project(hidden.transpose(1, 2)).transpose(1, 2) * mask
        means, log_variances = torch.split(stats, self.config.flow_size, dim=2)
        return hidden, means, log_variances
