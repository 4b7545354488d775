"""CausalDecoder: Qwen2, Qwen3 and Llama causal LMs with transformers 5.24's numerics and names.

The module tree mirrors ``{Qwen2,Qwen3,Llama}ForCausalLM`` (``model.embed_tokens``,
``model.layers.N.self_attn.q_proj`` ..., ``model.norm``, ``lm_head``), so a ``save_pretrained``
directory loads with ``load_state_dict`` + ``load_into`` and no renaming; the layers themselves are
in ``lm.layers``. A decoder may be built without its embedding or its lm_head, for models that use
a Llama stack inside something larger (Sesame CSM's backbone and depth decoder): it then takes
``inputs_embeds`` and returns hidden states, and ``from_state_dict`` loads it from a prefix of the
larger checkpoint.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Collection, Mapping
from os import PathLike
from typing import Literal, NamedTuple, cast

import torch
from torch import Tensor, nn

from mizuoto_runtime import ops
from mizuoto_runtime.accel import MaskInfo
from mizuoto_runtime.lm._deprecated import GONE, deprecated_arguments
from mizuoto_runtime.lm.cache import BufferCache, DynamicCache
from mizuoto_runtime.lm.config import DecoderConfig
from mizuoto_runtime.lm.layers import (
    Backbone,
    DecoderLayer,
    LayerWeights,
    RMSNorm,
    layer_forward,
    rms_norm,
)
from mizuoto_runtime.lm.mask import mask_for
from mizuoto_runtime.lm.rope import RopeState, Rotary, RotaryEmbedding
from mizuoto_runtime.lm.tensor_parallel import (
    TensorParallelGroups,
    TensorParallelLayer,
    shard_state_dict,
)
from mizuoto_runtime.weights.loading import LoadError, load_into, load_state_dict

__all__ = [
    "CausalDecoder",
    "DecoderLayer",
    "LayerWeights",
    "QwenDecoder",
    "RMSNorm",
    "Weights",
    "layer_forward",
    "rms_norm",
]

Cache = DynamicCache | BufferCache
Output = Literal["logits", "hidden"]


class Weights(NamedTuple):
    """Deprecated: what ``QwenDecoder.weights()`` returned."""

    embed: Tensor
    layers: tuple[LayerWeights, ...]
    norm: Tensor
    lm_head: Tensor


def _capturing(x: Tensor) -> bool:
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


class CausalDecoder(nn.Module):
    """A Qwen2, Qwen3 or Llama causal LM: ``forward(input_ids, cache) -> logits``.

    Build it in the dtype it runs in: ``CausalDecoder(config, dtype=torch.bfloat16)`` keeps RoPE's
    ``inv_freq`` in float32, as ``from_pretrained(dtype=torch.bfloat16)`` does, whereas
    ``.to(torch.bfloat16)`` rounds it, as upstream's ``.to()`` does.

    ``head=False`` builds it without ``lm_head`` (it returns hidden states only); ``embed=False``
    without ``model.embed_tokens`` (it takes ``inputs_embeds`` only).

    ``parallel`` (``mizuoto_runtime.parallel.Groups``) splits each layer over ranks: attention
    heads over ``attention_tp``, the MLP over ``dense_tp`` (``lm.tensor_parallel``); the
    embedding, final norm and lm_head stay whole on every rank, so every rank gets all logits.
    Without it, or with groups of one rank, the layers are the plain ones, bit for bit.
    """

    lm_head: nn.Linear | None

    def __init__(
        self,
        config: DecoderConfig,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        parallel: TensorParallelGroups | None = None,
        head: bool = True,
        embed: bool = True,
    ) -> None:
        super().__init__()
        if head and not embed and config.tie_word_embeddings:
            raise ValueError(
                "embed=False: a tied lm_head (tie_word_embeddings) is the embedding; "
                "build with embed=True, or head=False"
            )
        self.config = config
        tp = TensorParallelLayer.of(parallel, config)
        self.local_config = config if tp is None else tp.local(config)  # its cache is that wide
        self.model = Backbone(config, tp, embed=embed, dtype=dtype, device=device)
        self.lm_head = None
        if head:
            self.lm_head = ops.default.Linear(
                config.hidden_size, config.vocab_size, bias=False, dtype=dtype, device=device
            )
            if config.tie_word_embeddings and self.model.embed_tokens is not None:
                self.lm_head.weight = self.model.embed_tokens.weight

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | PathLike[str],
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        parallel: TensorParallelGroups | None = None,
    ) -> CausalDecoder:
        """Load a directory written by transformers' ``save_pretrained`` (config + safetensors).

        Weights already in ``dtype`` on ``device`` are used as they are (memory-mapped); others are
        converted, as ``from_pretrained(dtype=...)`` converts them. With ``parallel``, each rank
        takes its slice of the same full checkpoint.
        """
        config = DecoderConfig.from_pretrained(model_dir)
        with torch.device("meta"):
            decoder = cls(config, dtype=dtype, parallel=parallel)
        decoder._load(load_state_dict(model_dir, device=device), device)
        return decoder

    @classmethod
    def from_state_dict(
        cls,
        config: DecoderConfig,
        state_dict: Mapping[str, Tensor],
        *,
        prefix: str = "model.",
        head: bool = True,
        head_key: str = "lm_head.weight",
        skip: Collection[str] = (),
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        parallel: TensorParallelGroups | None = None,
    ) -> CausalDecoder:
        """A decoder whose ``model.*`` tensors are the keys under ``prefix`` of a larger checkpoint.

        ``prefix`` stands for ``model.`` (``"backbone_model."`` reads
        ``backbone_model.layers.0.mlp.up_proj.weight`` as ``model.layers.0.mlp.up_proj.weight``);
        the lm_head, when ``head``, is ``state_dict[head_key]``. ``skip`` names what under
        ``prefix`` is not the decoder's (``"inputs_embeds_projector"`` skips that key and the keys
        below it); skipping ``"embed_tokens"`` also builds the decoder without its embedding, so it
        takes ``inputs_embeds``. Loading is strict: every tensor the decoder holds must be there,
        and a key under ``prefix`` that is neither the decoder's nor skipped is an error; keys
        outside ``prefix`` belong to the rest of the model and are left alone. Errors
        (``LoadError``) name the checkpoint's keys. Tensors are used as they are where dtype and
        device match, as in ``from_pretrained``.
        """
        skipped = tuple(skip)
        embed = "embed_tokens" not in skipped
        with torch.device("meta"):
            decoder = cls(config, dtype=dtype, parallel=parallel, head=head, embed=embed)
        names: dict[str, str] = {}  # ours -> the checkpoint's
        for key in state_dict:
            rest = key[len(prefix) :]
            if not key.startswith(prefix) or any(
                rest == name or rest.startswith(name + ".") for name in skipped
            ):
                continue
            names["model." + rest] = key
        if head and head_key in state_dict:
            names["lm_head.weight"] = head_key
        state = {ours: state_dict[theirs] for ours, theirs in names.items()}
        try:
            decoder._load(state, device)
        except LoadError as error:
            raise _renamed(error, names, prefix) from error
        return decoder

    def _load(self, state: Mapping[str, Tensor], device: torch.device | str) -> None:
        state = {key: tensor.to(device) for key, tensor in state.items()}  # no-op where it is
        load_into(self, shard_state_dict(self, state), cast=True)
        self.model.rotary_emb = RotaryEmbedding(self.config, device=device)  # built on meta
        self.eval()

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

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
        input_ids: Tensor | None = None,
        cache: Cache | None = None,
        *,
        inputs_embeds: Tensor | None = None,
        positions: Tensor | None = None,
        padding_mask: Tensor | None = None,
        logits_to_keep: int = 0,
        output: Output = "logits",
        **deprecated: object,
    ) -> Tensor:
        """input_ids [B, L] (or inputs_embeds [B, L, hidden]) -> logits [B, L, V], or with
        ``output="hidden"`` the final norm's output [B, L, hidden] (upstream's
        ``last_hidden_state``); the last ``logits_to_keep`` positions only if > 0.

        ``cache`` holds the keys and values of the tokens before (``new_cache``) and takes these;
        ``positions`` [B or 1, L] default to the tokens after what it holds; ``padding_mask``
        [B, held + L] (1 = real token) is generate's 2D attention mask, for left-padded batches.
        """
        advance = deprecated_arguments(deprecated)
        if output not in ("logits", "hidden"):
            raise ValueError(f"output: expected 'logits' or 'hidden', got {output!r}")
        if output == "logits" and self.lm_head is None:
            raise ValueError(
                "output='logits': this decoder was built without lm_head (head=False); "
                "ask for output='hidden'"
            )
        x = self._embed(input_ids, inputs_embeds)  # [B, L, hidden]
        config = self.config
        batch, length, _ = x.shape
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
            device=x.device,
        )
        # A host-side length would be frozen into a captured graph, so none is given there.
        known = static and padding_mask is None and not _capturing(x)
        mask_info = MaskInfo(keys=held + length) if known else None

        model = self.model
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
        if self.lm_head is None or output == "hidden":
            return x  # [B, L or logits_to_keep, hidden]
        return self.lm_head(x)  # [B, L or logits_to_keep, V]

    def _embed(self, input_ids: Tensor | None, inputs_embeds: Tensor | None) -> Tensor:
        if inputs_embeds is not None:
            hidden = self.config.hidden_size
            if (
                input_ids is not None
                or inputs_embeds.dim() != 3
                or inputs_embeds.shape[2] != hidden
            ):
                raise ValueError(
                    f"inputs_embeds: expected [B, L, {hidden}] and input_ids=None, got "
                    f"{tuple(inputs_embeds.shape)} and input_ids="
                    f"{None if input_ids is None else tuple(input_ids.shape)}"
                )
            return inputs_embeds
        embed = self.model.embed_tokens
        if input_ids is None:
            raise ValueError("input_ids: expected [B, L] token ids (or inputs_embeds), got None")
        if embed is None:
            raise ValueError(
                "input_ids: this decoder was built without embed_tokens (embed=False); "
                "pass inputs_embeds [B, L, hidden] instead"
            )
        return embed(input_ids)

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
        embed, head = self.model.embed_tokens, self.lm_head
        if embed is None or head is None:
            raise ValueError("weights(): this decoder was built without embed_tokens or lm_head")
        return Weights(
            embed.weight,
            tuple(cast(DecoderLayer, layer).weights() for layer in self.model.layers),
            self.model.norm.weight,
            head.weight,
        )

    def rotary_table(self, length: int) -> Rotary | None:
        """Deprecated: the forward computes RoPE itself."""
        warnings.warn(GONE.format("QwenDecoder.rotary_table()"), DeprecationWarning, stacklevel=2)
        return self.model.rotary_emb.table(length, self.dtype)


QwenDecoder = CausalDecoder
"""The name engines built on Qwen use; the same class."""


def _renamed(error: LoadError, names: Mapping[str, str], prefix: str) -> LoadError:
    """``error`` with the decoder's key names turned back into the checkpoint's."""

    def theirs(key: str) -> str:
        if key in names:
            return names[key]
        return prefix + key.removeprefix("model.") if key.startswith("model.") else key

    line = re.compile(r"^(\s+\S+\s+)(\S+):", re.M)
    message = line.sub(lambda m: f"{m.group(1)}{theirs(m.group(2))}:", str(error))
    message = message.replace("into CausalDecoder", f"into CausalDecoder from {prefix!r}", 1)
    return LoadError(
        message,
        tuple(map(theirs, error.missing)),
        tuple(map(theirs, error.unexpected)),
        tuple(map(theirs, error.mismatched)),
    )
