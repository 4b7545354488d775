"""The attention mask transformers 5.24 builds for an sdpa decoder (``masking_utils.sdpa_mask``).

The mask is boolean, True meaning "attend": key ``j`` is visible to query ``i`` when
``j <= i + q_offset`` and the 2D padding mask allows ``j``. Whenever SDPA's ``is_causal`` flag (or
no mask at all) gives the same attention, upstream returns None instead, and which of the two is
used changes the kernel and so the bits: None for a DynamicCache without padding (prefill and
decode), None for a static cache's prefill into an empty cache, and always a mask for a static
cache's decode step.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["mask_for"]


def _all(mask: Tensor) -> bool:
    return bool(mask.sum() == mask.numel())  # upstream's fast_all


def _can_skip(padding: Tensor | None, q_length: int, kv_length: int, empty: bool) -> bool:
    # _ignore_causal_mask_sdpa, for full attention and no tracing.
    if padding is not None and padding.shape[-1] > kv_length:
        padding = padding[:, :kv_length]
    if (q_length == 1 or kv_length == q_length) and (padding is None or _all(padding)):
        return True
    return empty and (
        padding is None or (_all(padding[:, :q_length]) and _all(~padding[:, q_length:]))
    )


def mask_for(
    batch: int,
    q_length: int,
    kv_length: int,
    q_offset: int | Tensor = 0,
    padding_mask: Tensor | None = None,
    *,
    static: bool = False,
    empty: bool | None = None,
    device: torch.device | str = "cpu",
) -> Tensor | None:
    """The mask upstream passes to SDPA, or None where it relies on ``is_causal``.

    ``q_offset`` is how many tokens the cache held before this forward (a device tensor for a
    static cache, as upstream's ``cumulative_length``), ``kv_length`` how many keys attention
    sees (seen + new for a dynamic cache, the whole buffer for a static one), ``padding_mask``
    the 2D mask [B, seen + new] (1 = a real token), ``static`` whether the cache is a
    preallocated buffer (upstream's ``is_compileable``), ``empty`` whether the cache held nothing
    before (read from ``q_offset`` when None; a caller that knows it on the host saves that read).
    Returns [B, 1, q_length, kv_length].
    """
    padding = None
    if padding_mask is not None:
        padding = padding_mask.to(device=device, dtype=torch.bool)
        if (missing := kv_length - padding.shape[-1]) > 0:
            padding = torch.nn.functional.pad(padding, (0, missing))
    allow_skip = not (static and q_length == 1)
    if empty is None:
        empty = bool(q_offset == 0)
    if allow_skip and _can_skip(padding, q_length, kv_length, empty):
        return None
    q_index = (torch.arange(q_length, device=device) + q_offset)[None, None, :, None]
    kv_index = torch.arange(kv_length, device=device)[None, None, None, :]
    mask = torch.ones((), dtype=torch.bool, device=device) & (kv_index <= q_index)
    if padding is not None:
        batch_index = torch.arange(batch, device=device)[:, None, None, None]
        mask = mask & padding[batch_index, kv_index]
    mask = mask.expand(batch, -1, q_length, kv_length)
    return mask.contiguous() if static else mask  # generate makes a static cache's mask contiguous
