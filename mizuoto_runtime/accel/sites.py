"""Where attention runs in a model, and what upstream computes there.

A ``Site`` names one attention call in a ported model and holds upstream's exact computation at
that place (its reference). ``compute.attention = "auto"`` runs the reference, so a port stays bit
for bit equal to upstream; the other policies (``accel.policy``) may run a faster kernel with the
same meaning. ``MaskInfo`` tells those kernels what a dense mask holds, so that kernels taking key
lengths instead of a mask tensor can still run the call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import attrs
import torch
from torch import Tensor

__all__ = ["MaskInfo", "Reference", "Site", "sdpa_reference"]


# reference(q, k, v, *, mask, causal, scale, enable_gqa, dropout_p) -> output
Reference = Callable[..., Tensor]


class MaskInfo(NamedTuple):
    """What a dense mask expresses.

    ``keys``: every key from ``keys`` on is masked for every query (a preallocated cache holding
    ``keys`` tokens), and within the first ``keys`` the mask is bottom-right causal (``causal``)
    or lets every query see every key; None: the mask may hold anything (padding), and only
    kernels that take the mask tensor can run the call.
    """

    keys: int | None = None
    causal: bool = True


def sdpa_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    """``F.scaled_dot_product_attention`` called exactly as transformers' sdpa integration does.

    ``enable_gqa`` is only passed when set, as upstream passes it, so torch < 2.5 still runs
    calls without GQA.
    """
    extra = {"enable_gqa": True} if enable_gqa else {}
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale, is_causal=causal, **extra
    )


@attrs.frozen
class Site:
    """One attention call in a model: its name (for ``applied``) and upstream's computation.

    ``upstream`` says where the reference comes from (``"transformers 5.24 sdpa_attention"``), so
    a reader of ``ctx.applied`` can tell what "reference" meant.
    """

    name: str
    reference: Reference = sdpa_reference
    upstream: str = "torch.nn.functional.scaled_dot_product_attention"
