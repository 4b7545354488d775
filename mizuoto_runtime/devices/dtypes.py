"""Which precisions a device can compute in, kept as data: each rule says why.

Rules are checked against ``DeviceProperties`` (what torch reports about a device, or what a test
makes up), so the policy is testable without the hardware it describes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import attrs

from mizuoto_sdk.errors import ComputeUnavailable, InvalidRequest
from mizuoto_sdk.manifest import canonical_dtype

# Turing cards without tensor cores that produce NaNs / black output in float16.
_GTX16 = re.compile(
    r"\b(GTX 16\d\d|1660|1650|1630|T500|T550|T600|T1000|T1200|T2000|MX450|MX550|CMP 30HX)\b",
    re.IGNORECASE,
)


@attrs.frozen
class DeviceProperties:
    """What the dtype rules look at. ``capability`` is the CUDA compute capability."""

    type: str
    name: str = ""
    capability: tuple[int, int] | None = None
    hip: bool = False
    macos: tuple[int, ...] | None = None
    bf16: bool | None = None
    fp64: bool = True


@attrs.frozen
class DtypeRule:
    """``dtype`` does not work on devices for which ``applies`` is true, for ``reason``."""

    id: str
    dtype: str
    applies: Callable[[DeviceProperties], bool] = attrs.field(eq=False)
    reason: str


def _cuda(props: DeviceProperties) -> bool:
    return props.type == "cuda" and not props.hip


RULES: tuple[DtypeRule, ...] = (
    DtypeRule(
        "cuda.fp16_gtx16",
        "float16",
        lambda p: _cuda(p) and bool(_GTX16.search(p.name)),
        "GTX 16xx-class Turing cards produce NaNs (black or silent output) in float16",
    ),
    DtypeRule(
        "cuda.fp16_capability",
        "float16",
        lambda p: _cuda(p) and p.capability is not None and p.capability < (6, 0),
        "float16 arithmetic needs CUDA compute capability 6.0 or newer",
    ),
    DtypeRule(
        "cuda.bf16_capability",
        "bfloat16",
        lambda p: _cuda(p) and p.capability is not None and p.capability < (8, 0),
        "bfloat16 needs CUDA compute capability 8.0 (Ampere) or newer",
    ),
    DtypeRule(
        "mps.bf16_macos",
        "bfloat16",
        lambda p: p.type == "mps" and (p.macos or (0,)) < (14, 0),
        "MPS computes in bfloat16 only from macOS 14",
    ),
    DtypeRule("mps.fp64", "float64", lambda p: p.type == "mps", "MPS has no float64"),
    DtypeRule(
        "xpu.bf16",
        "bfloat16",
        lambda p: p.type == "xpu" and p.bf16 is False,
        "this XPU reports no bfloat16 support",
    ),
    DtypeRule(
        "xpu.fp64",
        "float64",
        lambda p: p.type == "xpu" and not p.fp64,
        "this XPU (e.g. Intel Arc) has no float64",
    ),
)


@attrs.frozen
class DtypeChoice:
    """The dtype picked, and every reason a preferred one was passed over."""

    dtype: str
    reasons: tuple[str, ...] = ()


def unsupported_reason(
    props: DeviceProperties, dtype: str, rules: Sequence[DtypeRule] = RULES
) -> str | None:
    """Why ``dtype`` does not work on the device, or None when it does."""
    name = dtype if dtype == "float64" else canonical_dtype(dtype)
    return next((r.reason for r in rules if r.dtype == name and r.applies(props)), None)


def requested_dtype(requested: str, supported: Sequence[str]) -> str:
    """``requested`` spelt canonically, when the engine lists it in ``supported``; anything else
    is an InvalidRequest naming ``dtype``."""
    try:
        wanted = canonical_dtype(requested)
    except (TypeError, ValueError) as error:
        raise InvalidRequest(str(error), {"field": "dtype"}) from None
    if wanted not in supported:
        raise InvalidRequest(
            f"dtype: {wanted} is not one of {', '.join(supported)}", {"field": "dtype"}
        )
    return wanted


def pick_dtype(
    props: DeviceProperties,
    requested: str | None,
    supported: Sequence[str],
    cpu: str = "float32",
    rules: Sequence[DtypeRule] = RULES,
) -> DtypeChoice:
    """The dtype a component runs in: the user's request if the device can, else the engine's
    preference order (``supported``), skipping what the device cannot do; ``cpu`` on CPU unless
    the user asked otherwise."""
    order = [canonical_dtype(d) for d in supported]
    reasons: list[str] = []
    if requested is not None:
        wanted = requested_dtype(requested, order)
        why = unsupported_reason(props, wanted, rules)
        if why is None:
            return DtypeChoice(wanted)
        reasons.append(f"{wanted} was requested, but {why}")
    elif props.type == "cpu" and cpu in order:
        return DtypeChoice(cpu, (f"{cpu} on CPU unless another dtype is asked for",))
    for candidate in order:
        why = unsupported_reason(props, candidate, rules)
        if why is None:
            return DtypeChoice(candidate, tuple(reasons))
        reasons.append(f"{candidate} skipped: {why}")
    raise ComputeUnavailable(
        f"no dtype of {', '.join(order)} works on this {props.type} device: {'; '.join(reasons)}",
        {"reason": "dtype_unsupported", "field": "dtype"},
    )
