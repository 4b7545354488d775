"""Tensor-parallel layers: one linear or embedding split over the ranks of a named group.

Megatron's split: a column-parallel linear holds a slice of the output features (no
communication: the next layer consumes the slice), a row-parallel linear holds the matching slice
of the input features and sums the partial products over the group with one all-reduce, a
vocabulary-parallel embedding holds a slice of the rows and sums the one rank's hit with the
others' zeros. A column/row pair around an elementwise op (SwiGLU, attention per head) costs one
all-reduce.

Every layer is built at its local shape and loads from the FULL checkpoint: ``shard_state_dict``
takes each rank's slice of the full tensors, so a TP engine reads the same files as a single-rank
one. The groups are any object with ``rank``/``size``/``all_reduce``/``all_gather`` by group name
(``mizuoto_runtime.parallel.Groups``); a group of one rank builds the plain layers, bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import attrs
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_runtime import ops
from mizuoto_runtime.lm.config import DecoderConfig
from mizuoto_sdk.errors import InvalidRequest

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TensorParallelGroups",
    "TensorParallelLayer",
    "VocabParallelEmbedding",
    "column_linear",
    "row_linear",
    "shard",
    "shard_bounds",
    "shard_state_dict",
]


class TensorParallelGroups(Protocol):
    """What these layers use of ``mizuoto_runtime.parallel.Groups``."""

    def rank(self, group: str = "world") -> int: ...
    def size(self, group: str = "world") -> int: ...
    def all_reduce(self, tensor: Tensor, group: str = "world") -> Tensor: ...
    def all_gather(self, tensor: Tensor, group: str = "world", dim: int = -1) -> Tensor: ...


def shard_bounds(total: int, size: int, rank: int) -> tuple[int, int]:
    """[start, end) of rank ``rank``'s slice of ``total`` rows over ``size`` ranks.

    torch.tensor_split's rule: the first ``total % size`` ranks hold one more.
    """
    base, extra = divmod(total, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def _split(total: int, groups: TensorParallelGroups, group: str, what: str) -> int:
    size = groups.size(group)
    if total % size:
        raise InvalidRequest(
            f"{what}={total} does not split evenly over {group} of size {size}; "
            f"choose a tp_size that divides {total}",
            {"field": f"{group}.size", "group": group, "size": size, what: total},
        )
    return total // size


def shard(tensor: Tensor, dim: int, groups: TensorParallelGroups, group: str) -> Tensor:
    """This rank's slice of the FULL ``tensor`` along ``dim`` (contiguous: a view where it is)."""
    start, end = shard_bounds(tensor.shape[dim], groups.size(group), groups.rank(group))
    return tensor.narrow(dim, start, end - start).contiguous()


class ColumnParallelLinear(ops.default.Linear):
    """y[..., out/tp] = x @ W[rank's rows].T: no communication unless ``gather_output``."""

    shard_dims: Mapping[str, int] = {"weight": 0, "bias": 0}

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        groups: TensorParallelGroups,
        group: str = "dense_tp",
        bias: bool = False,
        gather_output: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        local = _split(out_features, groups, group, "out_features")
        super().__init__(in_features, local, bias=bias, dtype=dtype, device=device)
        self.groups, self.group, self.gather_output = groups, group, gather_output

    def forward(self, input: Tensor) -> Tensor:
        out = F.linear(input, self.weight, self.bias)
        return self.groups.all_gather(out, self.group, dim=-1) if self.gather_output else out


def row_parallel_linear(
    x: Tensor, weight: Tensor, bias: Tensor | None, groups: TensorParallelGroups, group: str
) -> Tensor:
    """The partial products summed over ``group``; the (replicated) bias added once, after."""
    out = groups.all_reduce(F.linear(x, weight), group)
    return out if bias is None else out + bias


class RowParallelLinear(ops.default.Linear):
    """y = sum over ranks of x[..., in/tp] @ W[:, rank's columns].T, plus the bias once."""

    shard_dims: Mapping[str, int] = {"weight": 1}  # the bias is replicated

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        groups: TensorParallelGroups,
        group: str = "dense_tp",
        bias: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        local = _split(in_features, groups, group, "in_features")
        super().__init__(local, out_features, bias=bias, dtype=dtype, device=device)
        self.groups, self.group = groups, group

    def forward(self, input: Tensor) -> Tensor:
        return row_parallel_linear(input, self.weight, self.bias, self.groups, self.group)


class VocabParallelEmbedding(ops.default.Embedding):
    """Rows [start, end) of the table on each rank (any vocabulary size; ``shard_bounds``).

    An id outside this rank's rows looks up row 0 and is zeroed; the all-reduce adds the one rank
    that holds it to zeros, so the sum is that row exactly.
    """

    shard_dims: Mapping[str, int] = {"weight": 0}

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        groups: TensorParallelGroups,
        group: str = "dense_tp",
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        self.start, self.end = shard_bounds(num_embeddings, groups.size(group), groups.rank(group))
        super().__init__(self.end - self.start, embedding_dim, dtype=dtype, device=device)
        self.groups, self.group, self.total = groups, group, num_embeddings

    def forward(self, input: Tensor) -> Tensor:
        inside = (input >= self.start) & (input < self.end)
        local = torch.where(inside, input - self.start, 0)
        out = F.embedding(local, self.weight) * inside.unsqueeze(-1).to(self.weight.dtype)
        return self.groups.all_reduce(out, self.group)


def _split_over(groups: TensorParallelGroups | None, group: str) -> bool:
    return groups is not None and groups.size(group) > 1


def column_linear(
    in_features: int,
    out_features: int,
    groups: TensorParallelGroups | None,
    group: str,
    *,
    bias: bool,
    dtype: torch.dtype,
    device: torch.device | str | None,
) -> nn.Linear:
    """A ColumnParallelLinear over ``group``, or the plain layer where the group is one rank."""
    return _linear(
        ColumnParallelLinear, in_features, out_features, groups, group, bias, dtype, device
    )


def row_linear(
    in_features: int,
    out_features: int,
    groups: TensorParallelGroups | None,
    group: str,
    *,
    bias: bool,
    dtype: torch.dtype,
    device: torch.device | str | None,
) -> nn.Linear:
    """A RowParallelLinear over ``group``, or the plain layer where the group is one rank."""
    split = RowParallelLinear
    return _linear(split, in_features, out_features, groups, group, bias, dtype, device)


def _linear(
    split: type[ColumnParallelLinear] | type[RowParallelLinear],
    in_features: int,
    out_features: int,
    groups: TensorParallelGroups | None,
    group: str,
    bias: bool,
    dtype: torch.dtype,
    device: torch.device | str | None,
) -> nn.Linear:
    if groups is not None and _split_over(groups, group):
        return split(
            in_features,
            out_features,
            groups=groups,
            group=group,
            bias=bias,
            dtype=dtype,
            device=device,
        )
    return ops.default.Linear(in_features, out_features, bias=bias, dtype=dtype, device=device)


class TensorParallelLayer:
    """The two sums a decoder layer split over ranks adds: after o_proj and after down_proj.

    ``layer_forward`` calls these instead of its plain ``F.linear`` when a layer is split; a
    group of one rank sums nothing, so attention-only or MLP-only TP works too.
    """

    def __init__(
        self,
        groups: TensorParallelGroups,
        attention: str = "attention_tp",
        dense: str = "dense_tp",
    ) -> None:
        self.groups, self.attention, self.dense = groups, attention, dense

    def attention_out(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return row_parallel_linear(x, weight, bias, self.groups, self.attention)

    def mlp_out(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        return row_parallel_linear(x, weight, bias, self.groups, self.dense)

    def local(self, config: DecoderConfig) -> DecoderConfig:
        """``config`` as this rank's layers hold it: its share of the heads."""
        tp = self.groups.size(self.attention)
        heads, kv_heads = config.num_attention_heads // tp, config.num_key_value_heads // tp
        return attrs.evolve(config, num_attention_heads=heads, num_key_value_heads=kv_heads)

    @classmethod
    def of(
        cls, groups: TensorParallelGroups | None, config: DecoderConfig
    ) -> TensorParallelLayer | None:
        """The layer's sums, or None when neither group is split (the plain forward, bit for bit).

        Heads split whole: a tp size that divides neither the query nor the key/value heads
        is refused here, naming both counts, before anything is built.
        """
        if groups is None or not (
            _split_over(groups, "attention_tp") or _split_over(groups, "dense_tp")
        ):
            return None
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        tp = groups.size("attention_tp")
        if heads % tp or kv_heads % tp:
            raise InvalidRequest(
                f"attention.tp_size={tp} must divide num_attention_heads={heads} and "
                f"num_key_value_heads={kv_heads} (heads are split whole over attention_tp); "
                "choose an attention tp_size that divides both",
                {
                    "field": "parallel.attention.tp_size",
                    "tp_size": tp,
                    "num_attention_heads": heads,
                    "num_key_value_heads": kv_heads,
                },
            )
        _split(config.intermediate_size, groups, "dense_tp", "intermediate_size")
        return cls(groups)


def shard_state_dict(module: nn.Module, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``state`` (a FULL checkpoint) with every tensor of ``module``'s parallel layers cut to
    this rank's slice; the rest as it is. Then ``load_into(module, ...)`` as for one rank.

    A tensor whose full size does not match the layer's is refused, naming the key: the
    checkpoint was written for another model (or already sharded).
    """
    out = dict(state)
    for prefix, layer in module.named_modules():
        dims: Mapping[str, int] | None = getattr(layer, "shard_dims", None)
        if dims is None:
            continue
        groups: TensorParallelGroups = layer.groups
        size = groups.size(layer.group)
        for name, dim in dims.items():
            key = f"{prefix}.{name}" if prefix else name
            local = getattr(layer, name, None)
            if key not in out or local is None:
                continue  # load_into reports a missing key with the others
            full = out[key]
            expected = _full_size(layer, name, local.shape[dim], size)
            if full.dim() != local.dim() or full.shape[dim] != expected:
                raise InvalidRequest(
                    f"{key}: expected the full tensor with {expected} along dim {dim} "
                    f"(to split over {layer.group} of size {size}), got shape {tuple(full.shape)}",
                    {"field": key, "expected": expected, "shape": list(full.shape)},
                )
            out[key] = shard(full, dim, groups, layer.group)
    return out


def _full_size(layer: nn.Module, name: str, local: int, size: int) -> int:
    if isinstance(layer, VocabParallelEmbedding):
        return layer.total  # uneven rows: the full count, not local * size
    return local * size
