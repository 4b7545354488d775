"""The layers of a Qwen2 / Qwen3 / Llama decoder, with transformers 5.24's numerics and names.

``Backbone`` mirrors ``{Qwen2,Qwen3,Llama}Model`` (``embed_tokens``, ``layers.N.self_attn.q_proj``
..., ``norm``), so its state dict is upstream's. Every op is upstream's op with upstream's shapes
in upstream's order (a fused q/k/v projection would be faster and different in the last bit); the
parity tests check the bits against transformers. Layers are ``ops.default``: constructing them
draws no random numbers and costs nothing before the checkpoint is loaded.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypedDict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_runtime import ops
from mizuoto_runtime.accel import MaskInfo
from mizuoto_runtime.lm.attention import hf_sdpa
from mizuoto_runtime.lm.cache import BufferCache, DynamicCache
from mizuoto_runtime.lm.config import DecoderConfig
from mizuoto_runtime.lm.rope import Rotary, RotaryEmbedding, apply_rotary
from mizuoto_runtime.lm.tensor_parallel import TensorParallelLayer, column_linear, row_linear

__all__ = [
    "Backbone",
    "DecoderLayer",
    "LayerWeights",
    "RMSNorm",
    "attention_block",
    "layer_forward",
    "rms_norm",
]

Cache = DynamicCache | BufferCache


class _Placement(TypedDict):
    dtype: torch.dtype
    device: torch.device | str | None


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``Qwen2RMSNorm`` / ``LlamaRMSNorm``: normalise in float32, round back, then scale in the
    weight's dtype."""
    dtype = x.dtype
    h = x if dtype == torch.float32 else x.to(torch.float32)  # .to() is a no-op in float32
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (h if dtype == torch.float32 else h.to(dtype))


class RMSNorm(ops.default.RMSNorm):
    """An ``nn.RMSNorm`` (so ``init_random`` fills it) computing as transformers' norm does."""

    eps: float  # nn.RMSNorm allows None; this constructor always sets one

    def __init__(
        self, size: int, eps: float, *, dtype: torch.dtype, device: torch.device | str | None = None
    ) -> None:
        super().__init__(size, eps=eps, dtype=dtype, device=device)

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    """``{Qwen2,Qwen3,Llama}Attention``'s parameters (its forward is ``attention_block``); split
    by heads over ``attention_tp`` when ``tp`` is given (q/k/v column-, o_proj row-parallel)."""

    def __init__(
        self,
        config: DecoderConfig,
        tp: TensorParallelLayer | None = None,
        *,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        hidden, heads, kv_heads, dim = (
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        kw: _Placement = {"dtype": dtype, "device": device}
        on, qkv_bias = (None if tp is None else tp.groups, "attention_tp"), config.qkv_bias
        self.q_proj = column_linear(hidden, heads * dim, *on, bias=qkv_bias, **kw)
        self.k_proj = column_linear(hidden, kv_heads * dim, *on, bias=qkv_bias, **kw)
        self.v_proj = column_linear(hidden, kv_heads * dim, *on, bias=qkv_bias, **kw)
        self.o_proj = row_linear(heads * dim, hidden, *on, bias=config.o_bias, **kw)
        if config.qk_norm:
            self.q_norm = RMSNorm(dim, config.rms_norm_eps, **kw)
            self.k_norm = RMSNorm(dim, config.rms_norm_eps, **kw)


class MLP(nn.Module):
    def __init__(
        self,
        config: DecoderConfig,
        tp: TensorParallelLayer | None = None,
        *,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        kw: _Placement = {"dtype": dtype, "device": device}
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        on = (None if tp is None else tp.groups, "dense_tp")  # gate/up by columns, down by rows
        self.gate_proj = column_linear(hidden, inner, *on, bias=bias, **kw)
        self.up_proj = column_linear(hidden, inner, *on, bias=bias, **kw)
        self.down_proj = row_linear(inner, hidden, *on, bias=bias, **kw)


class LayerWeights(NamedTuple):
    """One layer's tensors (the parameters themselves), as ``layer_forward`` reads them."""

    input_norm: Tensor
    q: Tensor
    q_bias: Tensor | None
    k: Tensor
    k_bias: Tensor | None
    v: Tensor
    v_bias: Tensor | None
    o: Tensor
    o_bias: Tensor | None
    q_norm: Tensor | None
    k_norm: Tensor | None
    post_norm: Tensor
    gate: Tensor
    up: Tensor
    down: Tensor
    tp: TensorParallelLayer | None = None  # the sums of a layer split over ranks
    gate_bias: Tensor | None = None  # Llama's mlp_bias
    up_bias: Tensor | None = None
    down_bias: Tensor | None = None


class DecoderLayer(nn.Module):
    def __init__(
        self,
        config: DecoderConfig,
        index: int,
        tp: TensorParallelLayer | None = None,
        *,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        kw: _Placement = {"dtype": dtype, "device": device}
        self.config, self.index = config, index  # the index names its slot in the cache
        self.tp = tp
        self.self_attn = Attention(config, tp, **kw)
        self.mlp = MLP(config, tp, **kw)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)

    def forward(
        self,
        x: Tensor,
        rotary: Rotary,
        mask: Tensor | None,
        cache: Cache | None,
        mask_info: MaskInfo | None = None,
    ) -> Tensor:
        w = self.weights()
        return layer_forward(w, x, rotary, mask, cache, self.index, self.config, mask_info)

    def weights(self) -> LayerWeights:
        """This layer's parameters, looked up each call (a replaced parameter is seen).

        They are read from the dicts nn.Module keeps them in: its attribute lookup runs Python
        after a failed ordinary lookup, about a microsecond each, and a small model's decode step
        would spend a tenth of its time on the twenty per layer.
        """
        # Any: these dicts hold Module | None and Parameter | None, and narrowing each entry
        # would cost a call per lookup on this hot path; every entry read here is set.
        modules: dict[str, Any] = self._modules
        attn, mlp = modules["self_attn"]._modules, modules["mlp"]._modules
        q, k = attn["q_proj"]._parameters, attn["k_proj"]._parameters
        v, o = attn["v_proj"]._parameters, attn["o_proj"]._parameters
        gate, up = mlp["gate_proj"]._parameters, mlp["up_proj"]._parameters
        down = mlp["down_proj"]._parameters
        q_norm, k_norm = attn.get("q_norm"), attn.get("k_norm")  # Qwen3 only
        return LayerWeights(
            modules["input_layernorm"]._parameters["weight"],
            q["weight"],
            q["bias"],
            k["weight"],
            k["bias"],
            v["weight"],
            v["bias"],
            o["weight"],
            o["bias"],
            None if q_norm is None else q_norm._parameters["weight"],
            None if k_norm is None else k_norm._parameters["weight"],
            modules["post_attention_layernorm"]._parameters["weight"],
            gate["weight"],
            up["weight"],
            down["weight"],
            self.tp,
            gate["bias"],
            up["bias"],
            down["bias"],
        )


def attention_block(
    w: LayerWeights,
    x: Tensor,
    rotary: Rotary,
    mask: Tensor | None,
    cache: Cache | None,
    layer: int,
    config: DecoderConfig,
    mask_info: MaskInfo | None,
) -> Tensor:
    batch, length, _ = x.shape
    shape = (batch, length, -1, config.head_dim)
    q = F.linear(x, w.q, w.q_bias).view(shape)  # [B, L, H, D]
    k = F.linear(x, w.k, w.k_bias).view(shape)  # [B, L, KV, D]
    v = F.linear(x, w.v, w.v_bias).view(shape).transpose(1, 2)  # [B, KV, L, D]
    q_norm, k_norm = w.q_norm, w.k_norm
    if q_norm is not None and k_norm is not None:  # Qwen3: per-head RMSNorm before RoPE
        q = rms_norm(q, q_norm, config.rms_norm_eps)
        k = rms_norm(k, k_norm, config.rms_norm_eps)
    q, k = apply_rotary(q.transpose(1, 2), k.transpose(1, 2), rotary)
    if cache is not None:
        k, v = cache.update(layer, k, v)  # [B, KV, S, D]
    scale = config.head_dim**-0.5
    out = hf_sdpa(q, k, v, mask, groups=config.groups, scale=scale, mask_info=mask_info)
    out = out.reshape(batch, length, -1).contiguous()  # [B, L, H * D] (this rank's heads)
    if w.tp is not None:
        return w.tp.attention_out(out, w.o, w.o_bias)  # summed over attention_tp
    return F.linear(out, w.o, w.o_bias)


def layer_forward(
    w: LayerWeights,
    x: Tensor,
    rotary: Rotary,
    mask: Tensor | None,
    cache: Cache | None,
    layer: int,
    config: DecoderConfig,
    mask_info: MaskInfo | None = None,
) -> Tensor:
    eps = config.rms_norm_eps
    h = rms_norm(x, w.input_norm, eps)
    x = x + attention_block(w, h, rotary, mask, cache, layer, config, mask_info)
    h = rms_norm(x, w.post_norm, eps)
    h = F.silu(F.linear(h, w.gate, w.gate_bias)) * F.linear(h, w.up, w.up_bias)  # SwiGLU MLP
    down, tp = (w.down, w.down_bias), w.tp
    h = F.linear(h, *down) if tp is None else tp.mlp_out(h, *down)  # summed over dense_tp
    return x + h


class Backbone(nn.Module):
    """``{Qwen2,Qwen3,Llama}Model``: embeddings, layers, final norm (held as ``model`` for the
    names). Built with ``embed=False`` it holds no ``embed_tokens``: the caller embeds."""

    embed_tokens: nn.Embedding | None

    def __init__(
        self,
        config: DecoderConfig,
        tp: TensorParallelLayer | None = None,
        *,
        embed: bool = True,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        kw: _Placement = {"dtype": dtype, "device": device}
        self.embed_tokens = None
        if embed:
            self.embed_tokens = ops.default.Embedding(
                config.vocab_size, config.hidden_size, config.pad_token_id, **kw
            )
        self.layers = nn.ModuleList(
            DecoderLayer(config, index, tp, **kw) for index in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.rotary_emb = RotaryEmbedding(config, device=device)
