"""How one replica is cut across ranks: the parallel config and the rank layout it implies.

A replica runs on ``ranks`` processes. The outer sizes (pipeline stages, CFG branches) split them
into partitions; within one partition every domain (dense layers, attention, MoE) covers the same
ranks, each cut its own way into tensor-, context-, expert- and data-parallel groups. Model code
asks for its groups by name (``GROUP_NAMES``); the layout here says which ranks share each group,
so every rank builds the same groups from the same config. Checked once, before any process
starts. Torch-free: the host and the plan read it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs

from mizuoto_sdk.errors import InvalidRequest

__all__ = [
    "GROUP_NAMES",
    "PARALLEL_DOMAINS",
    "AttentionParallelConfig",
    "DenseParallelConfig",
    "MoeParallelConfig",
    "OuterParallelConfig",
    "ParallelConfig",
    "check_declared",
]

GROUP_NAMES: tuple[str, ...] = (
    "world",
    "pipeline",
    "cfg",
    "dense_tp",
    "dense_dp",
    "attention_tp",
    "attention_cp",
    "attention_dp",
    "moe_tp",
    "moe_ep",
    "moe_dp",
)
PARALLEL_DOMAINS: tuple[str, ...] = ("pipeline", "cfg", "dense", "attention", "moe")
_INNER = ("dense", "attention", "moe")
_RULE = (
    "within one pipeline/cfg partition every domain covers the same ranks "
    "(dense.tp_size*dense.dp_size = attention.tp_size*attention.cp_size*attention.dp_size = "
    "moe.tp_size*moe.ep_size*moe.dp_size)"
)


def _size(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest(
            f"{attribute.name}: expected a whole number >= 1, got {value!r}",
            {"field": attribute.name},
        )


def _size_field() -> int:
    return attrs.field(default=1, validator=_size)


@attrs.frozen
class OuterParallelConfig:
    """Pipeline stages and CFG branches: each is a partition of the replica's ranks."""

    pipeline_size: int = _size_field()
    cfg_size: int = _size_field()


@attrs.frozen
class DenseParallelConfig:
    """Dense (MLP) layers: ``tp_size`` ranks split each layer, ``dp_size`` copies of that split."""

    tp_size: int = _size_field()
    dp_size: int = _size_field()


@attrs.frozen
class AttentionParallelConfig:
    """Heads split over ``tp_size``, the sequence over ``cp_size``, ``dp_size`` copies."""

    tp_size: int = _size_field()
    cp_size: int = _size_field()
    dp_size: int = _size_field()


@attrs.frozen
class MoeParallelConfig:
    """Mixture of experts: ``tp_size`` splits an expert, ``ep_size`` spreads the experts."""

    tp_size: int = _size_field()
    ep_size: int = _size_field()
    dp_size: int = _size_field()


_Domain = DenseParallelConfig | AttentionParallelConfig | MoeParallelConfig
_CLASSES: Mapping[str, type[Any]] = {
    "outer": OuterParallelConfig,
    "dense": DenseParallelConfig,
    "attention": AttentionParallelConfig,
    "moe": MoeParallelConfig,
}
# Each inner domain's sizes, fastest-varying first (tp is fastest everywhere).
_AXES: Mapping[str, tuple[str, ...]] = {
    "dense": ("tp_size", "dp_size"),
    "attention": ("tp_size", "cp_size", "dp_size"),
    "moe": ("tp_size", "ep_size", "dp_size"),
}


def _covered(domain: _Domain) -> int:
    product = 1
    for name in attrs.fields_dict(type(domain)):
        product *= getattr(domain, name)
    return int(product)


def _spelled(name: str, domain: _Domain) -> str:
    sizes = "*".join(str(getattr(domain, axis)) for axis in _AXES[name])
    return f"{name} covers {sizes} = {_covered(domain)}"


def _check_rule(instance: ParallelConfig, attribute: object, value: object) -> None:
    given = {name: d for name in _INNER if (d := getattr(instance, name)) is not None}
    if len({_covered(d) for d in given.values()}) > 1:
        spelled = "; ".join(_spelled(name, d) for name, d in given.items())
        raise InvalidRequest(
            f"parallel: {_RULE}, but {spelled}; change the sizes so the products are equal, "
            "or leave a domain out (it then splits its layers over all the ranks by tensor "
            "parallelism)",
            {"field": "parallel", "rule": "same_scope"},
        )


def _domain_of(kind: type[Any]) -> Callable[[object, attrs.Attribute[Any], object], None]:
    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is not None and not isinstance(value, kind):
            raise InvalidRequest(
                f"{attribute.name}: expected a {kind.__name__} or None, got {value!r}",
                {"field": attribute.name},
            )

    return check


@attrs.frozen
class ParallelConfig:
    """How one replica is cut: ``outer`` partitions, then the ``dense``/``attention``/``moe`` cuts.

    A domain left None is not given: it is derived as tensor parallelism over the whole partition
    (``resolved``). The given domains must cover the same number of ranks (see ``_RULE``); the
    error names the rule and each domain's product.
    """

    outer: OuterParallelConfig = attrs.field(
        factory=OuterParallelConfig, validator=attrs.validators.instance_of(OuterParallelConfig)
    )
    dense: DenseParallelConfig | None = attrs.field(
        default=None, validator=_domain_of(DenseParallelConfig)
    )
    attention: AttentionParallelConfig | None = attrs.field(
        default=None, validator=_domain_of(AttentionParallelConfig)
    )
    moe: MoeParallelConfig | None = attrs.field(
        default=None, validator=[_domain_of(MoeParallelConfig), _check_rule]
    )

    @property
    def scope(self) -> int:
        """Ranks one pipeline/CFG partition spans: the given domains' common size, else 1."""
        for name in _INNER:
            domain = getattr(self, name)
            if domain is not None:
                return _covered(domain)
        return 1

    @property
    def ranks(self) -> int:
        """Ranks (processes) per replica."""
        return self.outer.pipeline_size * self.outer.cfg_size * self.scope

    @property
    def split_domains(self) -> frozenset[str]:
        """The given domains that actually split something (size > 1): what an engine must
        implement, and so declare in its manifest's ``parallel_domains``."""
        split = {
            name
            for name, size in (("pipeline", self.outer.pipeline_size), ("cfg", self.outer.cfg_size))
            if size > 1
        }
        split.update(
            name for name in _INNER if (d := getattr(self, name)) is not None and _covered(d) > 1
        )
        return frozenset(split)

    def resolved(self, name: str) -> _Domain:
        """Domain ``name``'s config, a derived one (``tp_size`` = ``scope``) when not given."""
        if name not in _INNER:
            raise InvalidRequest(
                f"parallel: no domain {name!r}; expected one of {', '.join(_INNER)}",
                {"field": "parallel", "known": list(_INNER)},
            )
        domain: _Domain | None = getattr(self, name)
        if domain is None:
            domain = _CLASSES[name](tp_size=self.scope)
        return domain

    @classmethod
    def from_mapping(cls, value: object, field: str = "parallel") -> ParallelConfig:
        """``{"dense": {"tp_size": 2}, "outer": {"pipeline_size": 2}}`` -> a config.

        ``field`` is the setting it came from; every error names the key under it that is wrong
        (``engines.x.parallel.dense.tp_size``) and what was expected.
        """
        if value is None:
            return cls()
        table = _table(field, value, f"tables named {', '.join(_CLASSES)}")
        parts: dict[str, object] = {}
        for name, sizes in table.items():
            key = f"{field}.{name}"
            if name not in _CLASSES:
                raise InvalidRequest(
                    f"{key}: unknown parallel domain {name!r}; expected one of "
                    f"{', '.join(_CLASSES)}",
                    {"field": key, "known": list(_CLASSES)},
                )
            kind = _CLASSES[name]
            known = list(attrs.fields_dict(kind))
            entries = _table(key, sizes, f"sizes such as {{{known[0]} = 2}}")
            for size_name, size in entries.items():
                if size_name not in known:
                    raise InvalidRequest(
                        f"{key}.{size_name}: unknown size; {name} has {', '.join(known)}",
                        {"field": f"{key}.{size_name}", "known": known},
                    )
                if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                    raise InvalidRequest(
                        f"{key}.{size_name}: expected a whole number >= 1, got {size!r}",
                        {"field": f"{key}.{size_name}"},
                    )
            parts[name] = kind(**entries)
        try:
            return cls(**parts)  # type: ignore[arg-type]  # each part's type checked above
        except InvalidRequest as error:
            raise InvalidRequest(
                f"{field}: {error.message.removeprefix('parallel: ')}",
                {**error.detail, "field": field},
            ) from None

    def as_mapping(self) -> dict[str, dict[str, int]]:
        """JSON-ready and accepted by ``from_mapping``: ``outer`` and the given domains, with
        all their sizes (a derived domain stays out, so it stays derived)."""
        parts = {"outer": self.outer, **{name: getattr(self, name) for name in _INNER}}
        return {name: attrs.asdict(part) for name, part in parts.items() if part is not None}

    def layout(self) -> dict[str, tuple[tuple[int, ...], ...]]:
        """Per group name, the groups of ranks that share it; each name's groups partition
        ``range(ranks)``, listed by their lowest rank, each group in rank order.

        rank = (pipeline_index * cfg_size + cfg_index) * scope + inner, and within the scope
        inner = (dp_index * cp_or_ep + cp_or_ep_index) * tp_size + tp_index: tensor parallelism is
        fastest-varying, so a TP group is a run of neighbouring ranks (one machine, one switch).
        """
        scope, cfg = self.scope, self.outer.cfg_size
        ranks = range(self.ranks)

        def outer_digits(rank: int) -> tuple[int, int, int]:
            partition, inner = divmod(rank, scope)
            return partition // cfg, partition % cfg, inner  # pipeline, cfg, inner

        groups = {
            "world": (tuple(ranks),),
            "pipeline": _partition(ranks, lambda r: outer_digits(r)[1:]),
            "cfg": _partition(ranks, lambda r: (outer_digits(r)[0], outer_digits(r)[2])),
        }
        for name in _INNER:
            domain = self.resolved(name)
            radices = [getattr(domain, axis) for axis in _AXES[name]]
            for axis_index, axis in enumerate(_AXES[name]):

                def key(
                    rank: int, axis_index: int = axis_index, radices: list[int] = radices
                ) -> tuple[int, ...]:
                    digits = _digits(rank % scope, radices)
                    return (rank // scope, *digits[:axis_index], *digits[axis_index + 1 :])

                groups[f"{name}_{axis.removesuffix('_size')}"] = _partition(ranks, key)
        return {name: groups[name] for name in GROUP_NAMES}


def _table(key: str, value: object, expected: str) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidRequest(
            f"{key}: expected a table of {expected}, got {value!r}", {"field": key}
        )
    return dict(value)


def _digits(number: int, radices: list[int]) -> list[int]:
    digits = []
    for radix in radices:
        number, digit = divmod(number, radix)
        digits.append(digit)
    return digits


def _partition(ranks: range, key: Callable[[int], tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """Ranks grouped by ``key``, groups in order of their lowest rank."""
    found: dict[tuple[int, ...], list[int]] = {}
    for rank in ranks:
        found.setdefault(key(rank), []).append(rank)
    return tuple(tuple(group) for group in found.values())


class _Declares(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def parallel_domains(self) -> tuple[str, ...]: ...


def check_declared(manifest: _Declares, parallel: ParallelConfig) -> None:
    """Refuse a config that splits a domain the engine's manifest does not declare, before any
    worker starts: an engine that does not implement a split would otherwise run as several
    unrelated copies of the model."""
    field = f"engines.{manifest.id}.parallel"
    undeclared = sorted(parallel.split_domains - set(manifest.parallel_domains))
    if not undeclared:
        return
    declared = ", ".join(manifest.parallel_domains)
    runs = (
        f"declares only {declared}"
        if declared
        else "declares no parallel domains: it runs one rank per replica"
    )
    raise InvalidRequest(
        f"{field} splits {', '.join(undeclared)} over {parallel.ranks} ranks, but engine "
        f"{manifest.id!r} {runs}; "
        + (
            f"remove {', '.join(_setting(field, name) for name in undeclared)}"
            if declared
            else f"remove {field} (use engines.{manifest.id}.replicas for more copies)"
        ),
        {"field": field, "engine": manifest.id, "undeclared": undeclared},
    )


def _setting(field: str, domain: str) -> str:
    return f"{field}.outer.{domain}_size" if domain in ("pipeline", "cfg") else f"{field}.{domain}"
