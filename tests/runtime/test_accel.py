"""accel.attention: the reference under "auto", and policies with checks and recorded fallbacks."""

from __future__ import annotations

from types import MappingProxyType

import pytest
import torch

from mizuoto_runtime import accel
from mizuoto_runtime.accel import KERNELS, AttentionCall, Kernel, MaskInfo, Site, attention
from mizuoto_runtime.context import RequestContext
from mizuoto_sdk import ComputeSettings, InvalidRequest
from mizuoto_sdk.compute import ATTENTION_POLICIES

SITE = Site("test.attention")


def tensors(batch=2, heads=4, kv_heads=2, length=5, keys=7, dim=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, length, dim, generator=g).to(dtype)
    k = torch.randn(batch, kv_heads, keys, dim, generator=g).to(dtype)
    v = torch.randn(batch, kv_heads, keys, dim, generator=g).to(dtype)
    return q, k, v


def in_context(policy: str, fn):
    ctx = RequestContext(compute=ComputeSettings(attention=policy))
    with ctx.bind():
        return fn(), ctx


def reference(q, k, v, **kwargs):
    extra = {"enable_gqa": True} if kwargs.pop("enable_gqa", False) else {}
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs, **extra)


CALLS = {
    "causal-gqa": ({"length": 6, "keys": 6}, {"causal": True, "enable_gqa": True}),
    "decode-gqa": ({"length": 1, "keys": 9}, {"enable_gqa": True, "scale": 0.3}),
    "bool-mask": ({"kv_heads": 4}, {"mask": "bool"}),
    "float-mask": ({"kv_heads": 4}, {"mask": "float"}),
}


def call_arguments(case: str):
    shape, options = CALLS[case]
    q, k, v = tensors(**shape)
    options = dict(options)
    if options.get("mask") == "bool":
        options["mask"] = torch.rand(q.shape[0], 1, q.shape[2], k.shape[2]) > 0.3
        options["mask"][..., 0] = True
    elif options.get("mask") == "float":
        options["mask"] = torch.randn(q.shape[0], 1, q.shape[2], k.shape[2])
    return q, k, v, options


@pytest.mark.parametrize("case", sorted(CALLS))
def test_auto_runs_the_sites_reference_bit_for_bit(case: str):
    q, k, v, options = call_arguments(case)
    expected = reference(
        q,
        k,
        v,
        attn_mask=options.get("mask"),
        is_causal=options.get("causal", False),
        scale=options.get("scale"),
        enable_gqa=options.get("enable_gqa", False),
    )
    assert torch.equal(attention(q, k, v, site=SITE, **options), expected)  # no context: auto
    out, ctx = in_context("auto", lambda: attention(q, k, v, site=SITE, **options))
    assert torch.equal(out, expected)
    assert ctx.applied["attention"] == {"test.attention": "reference"} and ctx.warnings == []


def test_a_site_runs_its_own_reference():
    seen = []

    def upstream(q, k, v, **kwargs):
        seen.append(sorted(kwargs))
        return q * 0

    q, k, v = tensors(kv_heads=4)
    out = attention(q, k, v, site=Site("custom", upstream, "an eager upstream"), causal=True)
    assert torch.equal(out, q * 0)
    assert seen == [["causal", "dropout_p", "enable_gqa", "mask", "scale"]]


@pytest.mark.parametrize("case", sorted(CALLS))
def test_sdpa_and_math_policies_compute_the_same_attention(case: str):
    q, k, v, options = call_arguments(case)
    expected = attention(q, k, v, site=SITE, **options)
    sdpa, ctx = in_context("sdpa", lambda: attention(q, k, v, site=SITE, **options))
    assert torch.equal(sdpa, expected) and ctx.applied["attention"] == {"test.attention": "sdpa"}
    math, ctx = in_context("math", lambda: attention(q, k, v, site=SITE, **options))
    torch.testing.assert_close(math, expected, rtol=1e-5, atol=1e-5)
    assert ctx.applied["attention"] == {"test.attention": "math"} and ctx.warnings == []


@pytest.mark.parametrize("policy", ["flash", "xformers", "sage"])
def test_unavailable_kernels_fall_back_and_say_so_once(policy: str):
    q, k, v = tensors(kv_heads=4)
    expected = attention(q, k, v, site=SITE, causal=True, scale=None)

    def twice():
        attention(q, k, v, site=SITE, causal=True)
        return attention(q, k, v, site=SITE, causal=True)

    out, ctx = in_context(policy, twice)
    assert torch.equal(out, expected)
    assert ctx.applied["attention"] == {"test.attention": "sdpa"}
    (warning,) = ctx.warnings  # once per site and reason, not per call
    kernel = KERNELS[policy]
    reason = "is not installed" if not accel.installed(kernel.package) else "CUDA"
    assert f"compute.attention={policy}" in warning and kernel.name in warning
    assert reason in warning and "used sdpa" in warning


def test_kernel_checks_name_what_does_not_fit():
    q, k, v = tensors(heads=4, kv_heads=2)
    plain = AttentionCall(q, k, v, None, False, None, True, 0.0, None)
    assert KERNELS["sdpa"].check(plain) is None
    assert "enable_gqa" in KERNELS["sdpa"].check(plain._replace(enable_gqa=False))
    assert "dropout" in KERNELS["math"].check(plain._replace(dropout_p=0.1))
    for fused in ("flash", "xformers", "sage"):
        assert "CUDA" in KERNELS[fused].check(plain)
    odd = AttentionCall(*tensors(heads=3, kv_heads=2), None, False, None, True, 0.0, None)
    assert "multiple" in KERNELS["math"].check(odd)


def test_a_kernel_that_fails_is_passed_over(monkeypatch: pytest.MonkeyPatch):
    def broken(call):
        raise RuntimeError("no kernel image for this GPU")

    kernels = dict(KERNELS, sdpa=Kernel("sdpa", None, lambda call: None, broken))
    monkeypatch.setattr(accel.policy, "KERNELS", MappingProxyType(kernels))
    q, k, v = tensors(kv_heads=4)
    out, ctx = in_context("sdpa", lambda: attention(q, k, v, site=SITE))
    torch.testing.assert_close(out, reference(q, k, v), rtol=1e-5, atol=1e-5)
    assert ctx.applied["attention"] == {"test.attention": "math"}
    assert "sdpa failed (RuntimeError: no kernel image" in ctx.warnings[0]


def test_out_of_memory_in_a_kernel_is_not_hidden(monkeypatch: pytest.MonkeyPatch):
    def oom(call):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    kernels = dict(KERNELS, math=Kernel("math", None, lambda call: None, oom))
    monkeypatch.setattr(accel.policy, "KERNELS", MappingProxyType(kernels))
    q, k, v = tensors(kv_heads=4)
    with pytest.raises(torch.OutOfMemoryError):
        in_context("math", lambda: attention(q, k, v, site=SITE))


def test_an_unknown_policy_is_refused_before_any_attention_runs():
    with pytest.raises(InvalidRequest, match=r"compute\.attention: expected one of auto, sdpa"):
        RequestContext(settings={"compute.attention": "fastest"})


@pytest.mark.parametrize("policy", ATTENTION_POLICIES)
def test_every_policy_the_settings_accept_runs(policy: str):
    q, k, v = tensors(kv_heads=4)
    out, ctx = in_context(policy, lambda: attention(q, k, v, site=SITE))
    torch.testing.assert_close(out, reference(q, k, v))
    assert ctx.applied["attention"]["test.attention"]


def test_several_kernels_at_one_site_are_all_recorded(monkeypatch: pytest.MonkeyPatch):
    def only_decode(call):
        return None if call.q.shape[-2] == 1 else "prefill not supported here"

    kernels = dict(KERNELS, math=Kernel("math", None, only_decode, KERNELS["math"].run))
    monkeypatch.setattr(accel.policy, "KERNELS", MappingProxyType(kernels))

    def prefill_then_decode():
        attention(*tensors(kv_heads=4, length=4), site=SITE)
        return attention(*tensors(kv_heads=4, length=1), site=SITE)

    _, ctx = in_context("math", prefill_then_decode)
    assert ctx.applied["attention"] == {"test.attention": "math+sdpa"}


def test_mask_info_lets_prefix_kernels_drop_the_mask():
    q, k, v = tensors(length=1, keys=12, kv_heads=2)
    info = MaskInfo(keys=7)
    call = AttentionCall(
        q, k, v, torch.ones(2, 1, 1, 12, dtype=torch.bool), False, None, True, 0, info
    )
    assert "CUDA" in KERNELS["flash"].check(call)  # on CPU; the mask itself is acceptable
    no_info = call._replace(mask_info=None)
    assert KERNELS["sdpa"].check(no_info) is None
    assert info._replace(causal=False).causal is False
