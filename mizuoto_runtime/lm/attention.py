"""transformers 5.24's sdpa attention for a causal decoder layer (``integrations/sdpa_attention``).

How upstream hands grouped-query attention to SDPA decides which kernel runs, and so the bits:
``enable_gqa=True`` when there is no mask and the head size is at most 256; else, for one query
token, the query heads are folded onto the key heads (``pack_gqa``); else keys and values are
repeated (``repeat_kv``). ``is_causal`` is set only for several queries without a mask, and a causal
prefill over a longer (static) buffer slices the keys to the queries. The attention itself goes
through ``accel.attention`` at ``QWEN_SDPA``, whose reference is upstream's exact SDPA call.
"""

from __future__ import annotations

from typing import overload

from torch import Tensor

from mizuoto_runtime.accel import MaskInfo, Site, attention, sdpa_reference

__all__ = ["QWEN_SDPA", "hf_sdpa", "pack_gqa", "repeat_kv"]

QWEN_SDPA = Site(
    "lm.qwen.self_attn",
    sdpa_reference,
    "transformers 5.24 integrations/sdpa_attention.py (Qwen2/Qwen3/Llama self-attention)",
)


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    # [B, KV, S, D] -> [B, KV * groups, S, D], each kv head repeated in place (repeat_interleave)
    if groups == 1:
        return x
    batch, heads, length, dim = x.shape
    x = x[:, :, None, :, :].expand(batch, heads, groups, length, dim)
    return x.reshape(batch, heads * groups, length, dim)


@overload
def pack_gqa(x: Tensor, groups: int) -> Tensor: ...
@overload
def pack_gqa(x: None, groups: int) -> None: ...
def pack_gqa(x: Tensor | None, groups: int) -> Tensor | None:
    # one query token: [B, H, 1, D] -> [B, KV, groups, D]; masks shared by all heads pass through
    if x is None or x.shape[1] == 1:
        return x
    batch, heads, _, dim = x.shape
    return x.reshape(batch, heads // groups, groups, dim)


def _gqa_in_sdpa(mask: Tensor | None, key: Tensor, value: Tensor) -> bool:
    # upstream decides by which accelerators the process has; the tensor's device stands in here
    if mask is None and key.shape[-1] == value.shape[-1] <= 256:
        return True
    return key.is_xpu or key.is_mps


def hf_sdpa(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    *,
    groups: int,
    scale: float,
    site: Site = QWEN_SDPA,
    mask_info: MaskInfo | None = None,
) -> Tensor:
    """q [B, H, L, D], k/v [B, KV, S, D], bool mask [B, 1, L, S] or None -> [B, L, H, D]."""
    q_length = query.shape[2]
    enable_gqa = False
    if groups > 1:
        if _gqa_in_sdpa(mask, key, value):
            enable_gqa = True
        elif q_length == 1:
            query, mask = pack_gqa(query, groups), pack_gqa(mask, groups)
            if mask_info is not None:  # the packed "queries" all sit at the same position
                mask_info = mask_info._replace(causal=False)
        else:
            key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    causal = q_length > 1 and mask is None
    if causal and key.shape[2] > q_length:  # prefill into an empty static buffer
        key, value = key[:, :, :q_length, :], value[:, :, :q_length, :]
    out = attention(
        query,
        key,
        value,
        site=site,
        mask=mask,
        causal=causal,
        scale=scale,
        enable_gqa=enable_gqa,
        mask_info=mask_info,
    )
    out = out.reshape(out.shape[0], -1, q_length, value.shape[-1])  # undoes pack_gqa
    return out.transpose(1, 2).contiguous()
