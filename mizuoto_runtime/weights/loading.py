"""Reading checkpoints (``checkpoint``), renaming their keys, and putting them into a module
without copying.

``load_state_dict`` reads safetensors memory-mapped (a tensor's bytes are read from the page cache
when first touched) and pickles with ``weights_only=True`` (loading never runs code), and turns
every way a checkpoint can be wrong into a ``CheckpointError`` that names the path. ``load_into`` is
strict: every missing, unexpected, mis-shaped or mis-typed key is reported in one ``LoadError``, and
when dtype and device already match the checkpoint's tensors become the parameters, so a mapped
file stays mapped and loading a model costs about as much as opening its file.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mizuoto_runtime.weights.checkpoint import CheckpointError, load_state_dict, names_preview
from mizuoto_sdk.errors import EngineUnavailable

__all__ = [
    "CheckpointError",
    "LoadError",
    "LoadResult",
    "fold_weight_norm",
    "load_into",
    "load_state_dict",
    "replace_prefixes",
    "strip_prefix",
]

_DETAIL_KEYS = 20  # keys per kind in LoadError.detail; the message lists them all


class LoadError(EngineUnavailable, ValueError):
    """A state dict does not fit a module; every offending key is listed, one per line.

    The weights on disk do not match the model, which the operator fixes, so the host reports
    ``engine_unavailable``; ``detail`` counts the keys and names the first few of each kind.
    """

    def __init__(
        self,
        message: str,
        missing: tuple[str, ...],
        unexpected: tuple[str, ...],
        mismatched: tuple[str, ...],
    ) -> None:
        detail: dict[str, object] = {"reason": "weights_do_not_fit"}
        for kind, keys in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("mismatched", mismatched),
        ):
            detail[kind] = list(keys[:_DETAIL_KEYS])
            detail[f"{kind}_count"] = len(keys)
        super().__init__(message, detail)
        self.missing = missing
        self.unexpected = unexpected
        self.mismatched = mismatched


@dataclass(frozen=True)
class LoadResult:
    """The keys ``load_into`` did not load: expected but absent, and present but not expected."""

    missing: tuple[str, ...]
    unexpected: tuple[str, ...]


def strip_prefix(state_dict: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The entries whose key starts with ``prefix``, with it removed; the others are left out.

    This picks a submodule's weights out of a whole-model checkpoint (``"decoder."``) or drops a
    wrapper's prefix (``"module."``). No key under ``prefix`` is an error, since loading nothing is
    never what was meant. Tensors are not copied.
    """
    out = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    if not out:
        heads = sorted({k.split(".", 1)[0] + "." for k in state_dict})
        raise ValueError(f"no key starts with {prefix!r}; keys start with {names_preview(heads)}")
    return out


def replace_prefixes(
    state_dict: Mapping[str, Tensor], replacements: Mapping[str, str]
) -> dict[str, Tensor]:
    """Rename keys by prefix: each key's longest matching ``old`` prefix becomes ``new``.

    Keys that match no prefix are kept as they are; ``{"": "model."}`` prefixes every key. Two keys
    renamed onto one name are an error naming both. Order and tensors are kept.
    """
    olds = sorted(replacements, key=len, reverse=True)
    out: dict[str, Tensor] = {}
    source: dict[str, str] = {}
    for key, value in state_dict.items():
        old = next((o for o in olds if key.startswith(o)), None)
        new_key = key if old is None else replacements[old] + key[len(old) :]
        if new_key in out:
            raise ValueError(
                f"replace_prefixes renames both {source[new_key]!r} and {key!r} to {new_key!r}"
            )
        out[new_key] = value
        source[new_key] = key
    return out


_WEIGHT_NORM_NAMES = (
    ("weight_g", "weight_v"),
    ("parametrizations.weight.original0", "parametrizations.weight.original1"),
)


def _weight_norm_pair(key: str) -> tuple[str, str, str] | None:
    for g_name, v_name in _WEIGHT_NORM_NAMES:
        for name in (g_name, v_name):
            if key == name or key.endswith("." + name):
                base = key[: len(key) - len(name)]
                return base, base + g_name, base + v_name
    return None


def fold_weight_norm(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Replace each weight-norm pair by the ``weight`` it stands for: ``g * v / ||v||``.

    Both namings are folded: ``torch.nn.utils.weight_norm``'s ``*.weight_g`` / ``*.weight_v`` and
    ``parametrizations.weight_norm``'s ``*.parametrizations.weight.original0`` / ``original1``.
    The norm runs over every dim of ``v`` except the one where ``g`` is not 1 (``dim=None``: a
    scalar ``g``, the whole tensor), as torch does; half-precision pairs are computed in float32
    and returned in ``v``'s dtype. The folded key takes the pair's place; other keys are kept.
    """
    out: dict[str, Tensor] = {}
    folded: set[str] = set()
    for key, value in state_dict.items():
        pair = _weight_norm_pair(key)
        if pair is None:
            if key in out:
                raise ValueError(f"fold_weight_norm: {key!r} is both stored and weight-normed")
            out[key] = value
            continue
        if key in folded:
            continue
        base, g_key, v_key = pair
        target = base + "weight"
        if g_key not in state_dict or v_key not in state_dict:
            raise ValueError(f"fold_weight_norm: {key!r} needs both {g_key!r} and {v_key!r}")
        if target in state_dict or target in out:
            raise ValueError(f"fold_weight_norm: {target!r} is both stored and weight-normed")
        out[target] = _fold(target, state_dict[g_key], state_dict[v_key])
        folded.update((g_key, v_key))
    return out


def _fold(name: str, g: Tensor, v: Tensor) -> Tensor:
    kept = [i for i, size in enumerate(g.shape) if size != 1]
    if g.dim() not in (0, v.dim()) or len(kept) > 1 or any(g.shape[i] != v.shape[i] for i in kept):
        raise ValueError(
            f"fold_weight_norm: {name}: g of shape {list(g.shape)} does not fit v of shape "
            f"{list(v.shape)}"
        )
    work = v.float() if v.dtype in (torch.float16, torch.bfloat16) else v
    dims = [i for i in range(v.dim()) if i not in kept]
    norm = torch.linalg.vector_norm(work, dim=dims, keepdim=True)
    return (work * (g.to(work.dtype) / norm)).to(v.dtype)


def load_into(
    module: nn.Module,
    state_dict: Mapping[str, Tensor],
    *,
    ignore: Collection[str] = (),
    strict: bool = True,
    cast: bool = False,
) -> LoadResult:
    """Make ``state_dict``'s tensors the parameters and persistent buffers of ``module``.

    Strict by default: keys the module expects but the checkpoint lacks, keys it holds but the
    module does not expect, shapes that differ and dtypes that differ are all reported together in
    one ``LoadError``, each key with what was expected and what was found. ``ignore`` holds key
    names or glob patterns (``"*.inv_freq"``) that may be missing or unexpected; ``strict=False``
    lets any key be missing or unexpected. Shape and dtype mismatches are errors either way.

    When a tensor already has the parameter's dtype and device (or the module is on ``meta``), it
    becomes the parameter as it is, not copied: a memory-mapped checkpoint stays mapped and shares
    storage with the model. A tensor on another device is moved there. A dtype that differs is an
    error, because a silent cast copies the whole model and may lose precision; ``cast=True``
    converts floating-point tensors to the dtype the module declares (build or ``.to()`` the module
    in the dtype it should run in, on ``meta`` that costs nothing). Integer and bool dtypes are
    never converted.

    Tied weights (one tensor under several names, as ``state_dict()`` lists them) stay tied: one
    name present in the checkpoint fills all of them, and several names must hold equal values.
    Returns the keys that were not loaded.
    """
    patterns = (ignore,) if isinstance(ignore, str) else tuple(ignore)
    expected, groups = _expected_tensors(module)
    missing: list[str] = []
    problems: list[str] = []
    mismatched: list[str] = []
    plan: list[tuple[list[str], Tensor]] = []
    for names in groups:
        present = [n for n in names if n in state_dict]
        if not present:
            missing.extend(names)
            continue
        target = expected[names[0]]
        bad = [
            (n, why) for n in present if (why := _mismatch(target, state_dict[n], cast)) is not None
        ]
        first = state_dict[present[0]]
        if not bad:
            bad = [
                (n, ("tied", f"shares one tensor with {present[0]}, but their values differ"))
                for n in present[1:]
                if not _same_values(first, state_dict[n])
            ]
        for name, why in bad:
            problems.append(f"  {why[0]:<10} {name}: {why[1]}")
            mismatched.append(name)
        if not bad:
            plan.append((names, first))
    unexpected = [k for k in state_dict if k not in expected]
    loud_missing = [k for k in missing if not _ignored(k, patterns)]
    loud_unexpected = [k for k in unexpected if not _ignored(k, patterns)]
    if not strict:
        loud_missing, loud_unexpected = [], []
    if problems or loud_missing or loud_unexpected:
        lines = [f"  {'missing':<10} {k}: expected {_describe(expected[k])}" for k in loud_missing]
        lines += [
            f"  {'unexpected':<10} {k}: found {_describe(state_dict[k])}" for k in loud_unexpected
        ]
        lines += problems
        counts = f"{len(loud_missing)} missing, {len(loud_unexpected)} unexpected, "
        counts += f"{len(mismatched)} mismatched"
        message = f"cannot load the state dict into {type(module).__name__} ({counts}):\n"
        message += "\n".join(lines) + _prefix_hint(loud_missing, loud_unexpected)
        raise LoadError(message, tuple(loud_missing), tuple(loud_unexpected), tuple(mismatched))
    with torch.no_grad():
        for names, source in plan:
            _assign(module, names, expected[names[0]], source)
    return LoadResult(missing=tuple(missing), unexpected=tuple(unexpected))


def _expected_tensors(module: nn.Module) -> tuple[dict[str, Tensor], list[list[str]]]:
    """Every parameter and persistent buffer by name, and the names grouped by tensor (ties)."""
    persistent = module.state_dict(keep_vars=True).keys()
    named: list[tuple[str, Tensor]] = [*module.named_parameters(remove_duplicate=False)]
    named += [*module.named_buffers(remove_duplicate=False)]
    expected = {name: t for name, t in named if name in persistent}
    by_tensor: dict[int, list[str]] = {}
    for name, tensor in expected.items():
        by_tensor.setdefault(id(tensor), []).append(name)
    order = {name: i for i, name in enumerate(persistent)}
    groups = sorted(by_tensor.values(), key=lambda names: order[names[0]])
    return expected, groups


def _mismatch(target: Tensor, found: Tensor, cast: bool) -> tuple[str, str] | None:
    if not isinstance(found, Tensor):
        return "type", f"expected a tensor, found {type(found).__name__}"
    if target.shape != found.shape:
        return "shape", f"expected {_describe(target)}, found {_describe(found)}"
    if target.dtype != found.dtype and not (
        cast and target.dtype.is_floating_point and found.dtype.is_floating_point
    ):
        floats = target.dtype.is_floating_point and found.dtype.is_floating_point
        fix = " (cast=True converts it)" if floats else ""
        return "dtype", f"expected {_describe(target)}, found {_describe(found)}{fix}"
    return None


def _same_values(a: Tensor, b: Tensor) -> bool:
    same_view = a.data_ptr() == b.data_ptr() and a.stride() == b.stride()
    return a.device == b.device and (same_view or torch.equal(a, b))


def _ignored(key: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)


def _describe(tensor: object) -> str:
    if not isinstance(tensor, Tensor):
        return f"a {type(tensor).__name__}"
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"


def _prefix_hint(missing: list[str], unexpected: list[str]) -> str:
    """Suggest the rename when the checkpoint's keys differ from the module's by one prefix."""

    def prefixes(keys: list[str], others: set[str]) -> Counter[str]:
        # For each key, the dotted heads whose removal leaves a key of the other side.
        return Counter(
            key[: i + 1]
            for key in keys
            for i, c in enumerate(key)
            if c == "." and key[i + 1 :] in others
        )

    if not missing or not unexpected:
        return ""
    extra = prefixes(unexpected, set(missing)).most_common(1)
    if extra and extra[0][1] == len(missing):
        return f"\nhint: the checkpoint's keys carry {extra[0][0]!r}; strip_prefix() removes it"
    lacking = prefixes(missing, set(unexpected)).most_common(1)
    if lacking and lacking[0][1] == len(unexpected):
        return (
            f"\nhint: the module's keys carry {lacking[0][0]!r}; "
            f"replace_prefixes(state_dict, {{'': {lacking[0][0]!r}}}) adds it"
        )
    return ""


def _assign(module: nn.Module, names: list[str], target: Tensor, source: Tensor) -> None:
    device = source.device if target.device.type == "meta" else target.device
    value = source.to(device=device, dtype=target.dtype)  # the same tensor when both match
    if isinstance(target, nn.Parameter):
        value = nn.Parameter(value, requires_grad=target.requires_grad)
    for name in names:
        owner, _, attr = name.rpartition(".")
        setattr(module.get_submodule(owner), attr, value)
