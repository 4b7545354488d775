"""The attention kernels a policy may pick, each with the calls it can run.

Every kernel computes what ``F.scaled_dot_product_attention`` computes for the same arguments
(q [B, Hq, L, D], k/v [B, Hkv, S, D], a bool or additive mask broadcastable to [B, Hq, L, S],
``causal`` aligned top-left as torch aligns it), in its own arithmetic. ``check`` returns why a
kernel cannot run a call (device, dtype, head size, mask, GQA) or None; a kernel whose package is
not installed is never a candidate. Optional packages are imported on first use only.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import NamedTuple

import attrs
import torch
from torch import Tensor

from mizuoto_runtime.accel.sites import MaskInfo, sdpa_reference

__all__ = ["KERNELS", "AttentionCall", "Kernel", "installed"]


class AttentionCall(NamedTuple):
    """The arguments of one ``accel.attention`` call (a tuple: torch.compile traces it)."""

    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor | None
    causal: bool
    scale: float | None
    enable_gqa: bool
    dropout_p: float
    mask_info: MaskInfo | None

    @property
    def groups(self) -> int:
        return self.q.shape[-3] // self.k.shape[-3]


@attrs.frozen
class Kernel:
    name: str
    package: str | None  # the import name of the package it needs; None: torch itself
    check: Callable[[AttentionCall], str | None]
    run: Callable[[AttentionCall], Tensor]


@functools.cache
def installed(package: str) -> bool:
    """Whether ``package`` can be imported (looked up once per process, nothing imported)."""
    return importlib.util.find_spec(package) is not None


_TORCH_VERSION = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


def _repeat(x: Tensor, groups: int) -> Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=-3)


def _gqa_problem(call: AttentionCall) -> str | None:
    if call.q.shape[-3] % call.k.shape[-3]:
        return f"{call.q.shape[-3]} query heads are not a multiple of {call.k.shape[-3]} kv heads"
    if call.groups > 1 and not call.enable_gqa:
        return "query and key head counts differ without enable_gqa"
    return None


def _sdpa_check(call: AttentionCall) -> str | None:
    return _gqa_problem(call)


def _sdpa_run(call: AttentionCall) -> Tensor:
    k, v, gqa = call.k, call.v, call.enable_gqa
    if gqa and _TORCH_VERSION < (2, 5):  # SDPA learnt enable_gqa in 2.5
        k, v, gqa = _repeat(k, call.groups), _repeat(v, call.groups), False
    return sdpa_reference(
        call.q,
        k,
        v,
        mask=call.mask,
        causal=call.causal,
        scale=call.scale,
        enable_gqa=gqa,
        dropout_p=call.dropout_p,
    )


def _math_check(call: AttentionCall) -> str | None:
    if call.dropout_p:
        return "dropout would draw from the process-wide generator"
    return _gqa_problem(call)


def _math_run(call: AttentionCall) -> Tensor:
    # transformers' eager attention: scores in the input dtype, softmax in float32.
    q, k, v = call.q, _repeat(call.k, call.groups), _repeat(call.v, call.groups)
    scale = q.shape[-1] ** -0.5 if call.scale is None else call.scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # [B, H, L, S]
    if call.causal:
        L, S = scores.shape[-2:]
        visible = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    if call.mask is not None:
        if call.mask.dtype == torch.bool:
            scores = scores.masked_fill(~call.mask, float("-inf"))
        else:
            scores = scores + call.mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


def _fused_problem(call: AttentionCall, dtypes: tuple[torch.dtype, ...]) -> str | None:
    """What the fused CUDA kernels (flash-attn, xformers, sage) all need."""
    if call.q.device.type != "cuda":
        return f"needs a CUDA tensor, got {call.q.device.type}"
    if call.q.dtype not in dtypes:
        return f"needs {' or '.join(map(str, dtypes))}, got {call.q.dtype}"
    if call.dropout_p:
        return "dropout would draw from the process-wide generator"
    if call.mask is not None and (call.mask_info is None or call.mask_info.keys is None):
        return "takes no dense mask, and this mask is not a plain causal prefix"
    if call.causal and call.q.shape[-2] != call.k.shape[-2]:
        return "aligns causal masks bottom-right; this call has more keys than queries"
    return _gqa_problem(call)


def _prefix(call: AttentionCall) -> tuple[Tensor, Tensor, bool]:
    """k, v limited to the valid prefix a MaskInfo describes, and whether to mask causally."""
    if call.mask is None:
        return call.k, call.v, call.causal
    info = call.mask_info
    assert info is not None and info.keys is not None
    causal = info.causal and call.q.shape[-2] > 1
    return call.k[..., : info.keys, :], call.v[..., : info.keys, :], causal


_HALF = (torch.float16, torch.bfloat16)


def _flash_check(call: AttentionCall) -> str | None:
    if (problem := _fused_problem(call, _HALF)) is not None:
        return problem
    if call.q.shape[-1] > 256 or call.q.shape[-1] % 8:
        return f"head size must be a multiple of 8 up to 256, got {call.q.shape[-1]}"
    return None


def _flash_run(call: AttentionCall) -> Tensor:
    flash_attn = importlib.import_module("flash_attn")
    k, v, causal = _prefix(call)
    # flash-attn takes [B, L, H, D] and handles GQA itself
    out = flash_attn.flash_attn_func(
        call.q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        softmax_scale=call.scale,
        causal=causal,
    )
    return out.transpose(1, 2)


def _xformers_check(call: AttentionCall) -> str | None:
    return _fused_problem(call, (torch.float16, torch.bfloat16, torch.float32))


def _xformers_run(call: AttentionCall) -> Tensor:
    ops = importlib.import_module("xformers.ops")
    biases = importlib.import_module("xformers.ops.fmha.attn_bias")
    k, v, causal = _prefix(call)
    k, v = _repeat(k, call.groups), _repeat(v, call.groups)
    bias = biases.LowerTriangularFromBottomRightMask() if causal else None
    out = ops.memory_efficient_attention(
        call.q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_bias=bias,
        scale=call.scale,
    )
    return out.transpose(1, 2)


def _sage_check(call: AttentionCall) -> str | None:
    if (problem := _fused_problem(call, _HALF)) is not None:
        return problem
    if call.q.shape[-1] not in (64, 96, 128):
        return f"head size must be 64, 96 or 128, got {call.q.shape[-1]}"
    if call.mask is not None and call.q.shape[-2] > 1:
        return "its causal alignment over a longer key prefix is unspecified"
    return None


def _sage_run(call: AttentionCall) -> Tensor:
    sageattention = importlib.import_module("sageattention")
    k, v, causal = _prefix(call)
    k, v = _repeat(k, call.groups), _repeat(v, call.groups)
    return sageattention.sageattn(
        call.q, k, v, tensor_layout="HND", is_causal=causal, sm_scale=call.scale
    )


KERNELS: Mapping[str, Kernel] = MappingProxyType(
    {
        "sdpa": Kernel("sdpa", None, _sdpa_check, _sdpa_run),
        "math": Kernel("math", None, _math_check, _math_run),
        "flash": Kernel("flash_attn", "flash_attn", _flash_check, _flash_run),
        "xformers": Kernel("xformers", "xformers", _xformers_check, _xformers_run),
        "sage": Kernel("sageattention", "sageattention", _sage_check, _sage_run),
    }
)
