"""QwenDecoder: Qwen2 / Qwen3 causal LMs with transformers 5.24's numerics and parameter names.

The module tree mirrors ``Qwen{2,3}ForCausalLM`` (``model.embed_tokens``, ``model.layers.N.
self_attn.q_proj`` ..., ``model.norm``, ``lm_head``), so a ``save_pretrained`` directory loads with
``load_state_dict`` + ``load_into`` and no renaming. Every op is upstream's op with upstream's
shapes in upstream's order (a fused q/k/v projection would be faster and different in the last
bit); the parity tests check the bits against transformers. Layers are ``ops.default``:
constructing a model draws no random numbers and costs nothing before the checkpoint is loaded.
"""

from __future__ import annotations

import warnings
from os import PathLike
from typing import Any, NamedTuple, TypedDict, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_runtime import ops
from mizuoto_runtime.accel import MaskInfo
from mizuoto_runtime.lm._deprecated import GONE, deprecated_arguments
from mizuoto_runtime.lm.attention import hf_sdpa
from mizuoto_runtime.lm.cache import BufferCache, DynamicCache
from mizuoto_runtime.lm.config import QwenConfig
from mizuoto_runtime.lm.mask import mask_for
from mizuoto_runtime.lm.rope import RopeState, Rotary, RotaryEmbedding, apply_rotary
from mizuoto_runtime.lm.tensor_parallel import (
    TensorParallelGroups,
    TensorParallelLayer,
    column_linear,
    row_linear,
    shard_state_dict,
)
from mizuoto_runtime.weights.loading import load_into, load_state_dict

__all__ = ["LayerWeights", "QwenDecoder", "RMSNorm", "Weights", "layer_forward", "rms_norm"]

Cache = DynamicCache | BufferCache


class _Placement(TypedDict):
    dtype: torch.dtype
    device: torch.device | str | None


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``Qwen2RMSNorm``: normalise in float32, round back, then scale in the weight's dtype."""
    dtype = x.dtype
    h = x if dtype == torch.float32 else x.to(torch.float32)  # .to() is a no-op in float32
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (h if dtype == torch.float32 else h.to(dtype))


class RMSNorm(ops.default.RMSNorm):
    """An ``nn.RMSNorm`` (so ``init_random`` fills it) computing as transformers' Qwen norm."""

    eps: float  # nn.RMSNorm allows None; this constructor always sets one

    def __init__(
        self, size: int, eps: float, *, dtype: torch.dtype, device: torch.device | str | None = None
    ) -> None:
        super().__init__(size, eps=eps, dtype=dtype, device=device)

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    """``Qwen{2,3}Attention``'s parameters (its forward is ``attention_block``); split by heads
    over ``attention_tp`` when ``tp`` is given (q/k/v column-parallel, o_proj row-parallel)."""

    def __init__(
        self,
        config: QwenConfig,
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
        config: QwenConfig,
        tp: TensorParallelLayer | None = None,
        *,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        kw: _Placement = {"dtype": dtype, "device": device}
        hidden, inner = config.hidden_size, config.intermediate_size
        on = (None if tp is None else tp.groups, "dense_tp")  # gate/up by columns, down by rows
        self.gate_proj = column_linear(hidden, inner, *on, bias=False, **kw)
        self.up_proj = column_linear(hidden, inner, *on, bias=False, **kw)
        self.down_proj = row_linear(inner, hidden, *on, bias=False, **kw)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        config: QwenConfig,
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
            mlp["gate_proj"]._parameters["weight"],
            mlp["up_proj"]._parameters["weight"],
            mlp["down_proj"]._parameters["weight"],
            self.tp,
        )


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


class Weights(NamedTuple):
    """Deprecated: what ``QwenDecoder.weights()`` returned."""

    embed: Tensor
    layers: tuple[LayerWeights, ...]
    norm: Tensor
    lm_head: Tensor


def attention_block(
    w: LayerWeights,
    x: Tensor,
    rotary: Rotary,
    mask: Tensor | None,
    cache: Cache | None,
    layer: int,
    config: QwenConfig,
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
    config: QwenConfig,
    mask_info: MaskInfo | None = None,
) -> Tensor:
    eps = config.rms_norm_eps
    h = rms_norm(x, w.input_norm, eps)
    x = x + attention_block(w, h, rotary, mask, cache, layer, config, mask_info)
    h = rms_norm(x, w.post_norm, eps)
    h = F.silu(F.linear(h, w.gate)) * F.linear(h, w.up)  # SwiGLU MLP
    h = F.linear(h, w.down) if w.tp is None else w.tp.mlp_out(h, w.down)  # summed over dense_tp
    return x + h


class Backbone(nn.Module):
    """``Qwen{2,3}Model``: embeddings, layers, final norm (held as ``model`` for the names)."""

    def __init__(
        self,
        config: QwenConfig,
        tp: TensorParallelLayer | None = None,
        *,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        kw: _Placement = {"dtype": dtype, "device": device}
        self.embed_tokens = ops.default.Embedding(
            config.vocab_size, config.hidden_size, config.pad_token_id, **kw
        )
        self.layers = nn.ModuleList(
            DecoderLayer(config, index, tp, **kw) for index in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.rotary_emb = RotaryEmbedding(config, device=device)


def _capturing(x: Tensor) -> bool:
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


class QwenDecoder(nn.Module):
    """A Qwen2 or Qwen3 causal LM: ``forward(input_ids, cache) -> logits``.

    Build it in the dtype it runs in: ``QwenDecoder(config, dtype=torch.bfloat16)`` keeps RoPE's
    ``inv_freq`` in float32, as ``from_pretrained(dtype=torch.bfloat16)`` does, whereas
    ``.to(torch.bfloat16)`` rounds it, as upstream's ``.to()`` does.

    ``parallel`` (``mizuoto_runtime.parallel.Groups``) splits each layer over ranks: attention
    heads over ``attention_tp``, the MLP over ``dense_tp`` (``lm.tensor_parallel``); the
    embedding, final norm and lm_head stay whole on every rank, so every rank gets all logits.
    Without it, or with groups of one rank, the layers are the plain ones, bit for bit.
    """

    def __init__(
        self,
        config: QwenConfig,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        parallel: TensorParallelGroups | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        tp = TensorParallelLayer.of(parallel, config)
        self.local_config = config if tp is None else tp.local(config)  # its cache is that wide
        self.model = Backbone(config, tp, dtype=dtype, device=device)
        self.lm_head = ops.default.Linear(
            config.hidden_size, config.vocab_size, bias=False, dtype=dtype, device=device
        )
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | PathLike[str],
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        parallel: TensorParallelGroups | None = None,
    ) -> QwenDecoder:
        """Load a directory written by transformers' ``save_pretrained`` (config + safetensors).

        Weights already in ``dtype`` on ``device`` are used as they are (memory-mapped); others are
        converted, as ``from_pretrained(dtype=...)`` converts them. With ``parallel``, each rank
        takes its slice of the same full checkpoint.
        """
        config = QwenConfig.from_pretrained(model_dir)
        with torch.device("meta"):
            decoder = cls(config, dtype=dtype, parallel=parallel)
        state = load_state_dict(model_dir, device=device)
        load_into(decoder, shard_state_dict(decoder, state), cast=True)
        decoder.model.rotary_emb = RotaryEmbedding(config, device=device)
        return decoder.eval()

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def new_cache(self, kind: str = "dynamic", *, batch: int = 1, max_length: int = 0) -> Cache:
        """An empty cache: ``"dynamic"`` (room reserved for ``max_length`` tokens), or
        ``"static"`` (a BufferCache of ``max_length``)."""
        cache: Cache
        if kind == "static":
            cache = BufferCache(
                self.local_config, batch, max_length, dtype=self.dtype, device=self.device
            )
        elif kind == "dynamic":
            cache = DynamicCache(self.config, reserve=max_length)
        else:
            raise ValueError(f"cache kind: expected 'dynamic' or 'static', got {kind!r}")
        if max_length:  # RoPE rows for the positions it will hold, sliced by default positions
            cache.rope.table = self.model.rotary_emb.table(max_length, self.dtype)
        return cache

    def forward(
        self,
        input_ids: Tensor,
        cache: Cache | None = None,
        *,
        positions: Tensor | None = None,
        padding_mask: Tensor | None = None,
        logits_to_keep: int = 0,
        **deprecated: object,
    ) -> Tensor:
        """input_ids [B, L] -> logits [B, L, V] (the last ``logits_to_keep`` positions if > 0).

        ``cache`` holds the keys and values of the tokens before (``new_cache``) and takes these;
        ``positions`` [B or 1, L] default to the tokens after what it holds; ``padding_mask``
        [B, held + L] (1 = real token) is generate's 2D attention mask, for left-padded batches.
        """
        advance = deprecated_arguments(deprecated)
        config = self.config
        batch, length = input_ids.shape
        offset = 0 if cache is None else cache.offset
        held = 0 if cache is None else cache.length
        static = cache is not None and cache.static
        kv_length = cache.max_length if cache is not None and cache.static else held + length
        mask = mask_for(
            batch,
            length,
            kv_length,
            offset,
            padding_mask,
            static=static,
            empty=held == 0,
            device=input_ids.device,
        )
        # A host-side length would be frozen into a captured graph, so none is given there.
        known = static and padding_mask is None and not _capturing(input_ids)
        mask_info = MaskInfo(keys=held + length) if known else None

        model = self.model
        x = model.embed_tokens(input_ids)  # [B, L, hidden]
        state = RopeState(config.max_position_embeddings) if cache is None else cache.rope
        rotary = state.rows(held, length) if positions is None else None
        if rotary is None:
            rotary = self._rotary(x, positions, padding_mask, state, held)
        if cache is not None:
            cache.begin(length)
        for layer in model.layers:
            x = layer(x, rotary, mask, cache, mask_info)  # [B, L, hidden]
        if cache is not None and advance:
            cache.advance(length)
        x = model.norm(x)
        if logits_to_keep:
            x = x[:, -logits_to_keep:, :]
        return self.lm_head(x)  # [B, L or logits_to_keep, V]

    def _rotary(
        self,
        x: Tensor,
        positions: Tensor | None,
        padding_mask: Tensor | None,
        state: RopeState,
        held: int,
    ) -> Rotary:
        """cos, sin [B or 1, L, D] of ``positions`` (default: the tokens after those held)."""
        length = x.shape[1]
        if positions is None:
            positions = torch.arange(length, device=x.device)[None] + held  # [1, L]
        seen = held + length  # max(positions) + 1, which dynamic NTK needs on the host
        if padding_mask is not None and self.config.rope.rope_type == "dynamic":
            seen = int(positions.max()) + 1
        rope = self.model.rotary_emb
        return Rotary.of(*rope(x, positions, rope.frequencies(positions, state, seen)))

    def weights(self) -> Weights:
        """Deprecated: the forward reads its parameters itself."""
        warnings.warn(GONE.format("QwenDecoder.weights()"), DeprecationWarning, stacklevel=2)
        return Weights(
            self.model.embed_tokens.weight,
            tuple(cast(DecoderLayer, layer).weights() for layer in self.model.layers),
            self.model.norm.weight,
            self.lm_head.weight,
        )

    def rotary_table(self, length: int) -> Rotary | None:
        """Deprecated: the forward computes RoPE itself."""
        warnings.warn(GONE.format("QwenDecoder.rotary_table()"), DeprecationWarning, stacklevel=2)
        return self.model.rotary_emb.table(length, self.dtype)
