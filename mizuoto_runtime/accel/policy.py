"""``attention()``: the one way runtime code runs attention, and the policy that picks its kernel.

``compute.attention`` (the bound request's ``ctx.compute.attention``) chooses:

- ``auto`` (default, and whenever no request is bound): the site's reference, upstream's exact
  call, so results equal upstream bit for bit;
- ``sdpa``, ``math``, ``flash``, ``xformers``, ``sage``: the named kernel when it can run the call,
  else the next candidate (``sdpa``, then ``math``). A kernel whose package is not installed is not
  a candidate. What ran is recorded per site in ``ctx.applied["attention"]``; a fallback also adds
  one warning (once per site and reason) to ``ctx.warnings``. No choice ever fails a call: when no
  kernel can run it, the reference does.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch
from torch import Tensor

from mizuoto_runtime.accel.kernels import KERNELS, AttentionCall, installed
from mizuoto_runtime.accel.sites import MaskInfo, Site
from mizuoto_runtime.context import RequestContext, current_context
from mizuoto_runtime.devices.device import is_oom
from mizuoto_sdk.compute import ComputeSettings

__all__ = ["POLICIES", "attention", "policy_of"]

# policy -> kernels in preference order; the first is what the policy asks for.
POLICIES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "sdpa": ("sdpa", "math"),
        "math": ("math", "sdpa"),
        "flash": ("flash", "sdpa", "math"),
        "xformers": ("xformers", "sdpa", "math"),
        "sage": ("sage", "sdpa", "math"),
    }
)
SETTING = "compute.attention"  # its name, for messages


def policy_of(ctx: RequestContext | None) -> str:
    """The attention policy of a request (the default, ``auto``, when none is bound)."""
    return ComputeSettings().attention if ctx is None else ctx.compute.attention


def _record(ctx: RequestContext, site: Site, kernel: str) -> None:
    used = ctx.applied.setdefault("attention", {})
    before = used.get(site.name)
    if before == kernel:
        return
    names = {kernel} if before is None else {*before.split("+"), kernel}
    used[site.name] = "+".join(sorted(names))


def _warn_once(ctx: RequestContext, message: str) -> None:
    if message not in ctx.warnings:
        ctx.warn(message)


def _reference(site: Site, call: AttentionCall) -> Tensor:
    return site.reference(
        call.q,
        call.k,
        call.v,
        mask=call.mask,
        causal=call.causal,
        scale=call.scale,
        enable_gqa=call.enable_gqa,
        dropout_p=call.dropout_p,
    )


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    site: Site,
    mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    dropout_p: float = 0.0,
    mask_info: MaskInfo | None = None,
) -> Tensor:
    """Attention of q [B, Hq, L, D] over k, v [B, Hkv, S, D] -> [B, Hq, L, D].

    The arguments mean what they mean to ``F.scaled_dot_product_attention``; ``mask_info`` says
    what ``mask`` holds, for kernels that take key lengths instead of a mask tensor.
    """
    call = AttentionCall(q, k, v, mask, causal, scale, enable_gqa, dropout_p, mask_info)
    if torch.compiler.is_compiling():
        # A compiled region cannot read the request's context; it traces the reference, which
        # the compiler then lowers to its own kernel (compile_module records this in applied).
        return _reference(site, call)
    ctx = current_context()
    policy = policy_of(ctx)
    if policy == "auto":
        if ctx is not None:
            _record(ctx, site, "reference")
        return _reference(site, call)
    assert ctx is not None
    candidates = POLICIES[policy]  # ComputeSettings admits only these and auto
    passed_over: list[str] = []
    for name in candidates:
        kernel = KERNELS[name]
        if kernel.package is not None and not installed(kernel.package):
            passed_over.append(f"{kernel.name} is not installed")
            continue
        if (problem := kernel.check(call)) is not None:
            passed_over.append(f"{kernel.name} {problem}")
            continue
        try:
            out = kernel.run(call)
        except Exception as error:  # a kernel that fails (old GPU, odd build) is passed over
            if is_oom(error):
                raise
            passed_over.append(f"{kernel.name} failed ({type(error).__name__}: {error})")
            continue
        _record(ctx, site, kernel.name)
        if passed_over:
            reasons = "; ".join(passed_over)
            _warn_once(ctx, f"{SETTING}={policy} at {site.name}: {reasons}; used {kernel.name}")
        return out
    reasons = "; ".join(passed_over)
    _warn_once(ctx, f"{SETTING}={policy} at {site.name}: {reasons}; ran the reference")
    _record(ctx, site, "reference")
    return _reference(site, call)
