"""Named process groups: how model code on one rank of a replica talks to the others.

An engine addresses communication by the group's name (``dense_tp``, ``attention_cp``, ``world``
...), never by ``RANK`` or ``WORLD_SIZE``: the layout (``ParallelConfig.layout()``) says which
ranks share each group, and ``Groups`` holds one torch.distributed process group per distinct
group. ``Groups.single()`` is what a single-rank replica sees: rank 0 of 1 everywhere, collectives
that return their input, and nothing global touched. Importing this module does not import torch.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.parallel import GROUP_NAMES

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

Layout = Mapping[str, Sequence[Sequence[int]]]


class Groups:
    """This rank's groups by name, with the collectives model code needs.

    Build one with ``single()`` or ``start()``. A group of one rank has no process group: its
    collectives return the input as it is, so a TP-ready module costs nothing at tp=1.
    """

    def __init__(
        self,
        rank: int,
        members: Mapping[str, tuple[int, ...]],
        handles: Mapping[str, ProcessGroup | None],
        *,
        started: bool,
    ) -> None:
        self._rank = rank
        self._members = dict(members)
        self._handles = dict(handles)
        self._started = started

    @classmethod
    def single(cls) -> Groups:
        """Rank 0 of 1 in every group; no process group and no global state."""
        return cls(0, {name: (0,) for name in GROUP_NAMES}, {}, started=False)

    @classmethod
    def start(
        cls,
        layout: Layout,
        rank: int | None,
        *,
        init_method: str,
        backend: str = "gloo",
        timeout: float = 60.0,
    ) -> Groups:
        """Join the replica's ranks and make every group of ``layout``; blocks until all joined.

        Every rank of the replica calls this with the same layout. It initialises torch's default
        process group, which is process-global: call it once, in a worker process, at replica
        start (or in a process an external launcher started for one rank). torch.distributed
        wants every rank to create every group (even those it is not in) in the same order, so
        groups are made name by name in ``GROUP_NAMES`` order.

        ``rank`` None: the process's rank is the launcher's (``init_method="env://"``, where
        torch reads what torchrun set); its world must have as many ranks as the layout.
        """
        import torch.distributed as dist

        wait = datetime.timedelta(seconds=timeout)
        if rank is None:
            dist.init_process_group(backend, init_method=init_method, timeout=wait)
            rank, launched = dist.get_rank(), dist.get_world_size()
            needed = len(layout["world"][0]) if layout.get("world") else 0
            if launched != needed:
                dist.destroy_process_group()
                raise InvalidRequest(
                    f"the launcher started {launched} processes, and the parallel config needs "
                    f"{needed} ranks: start {needed} (torchrun --nproc-per-node, --nnodes) or "
                    "change engines.<id>.parallel",
                    {"field": "parallel", "launched": launched, "needed": needed},
                )
            members = _check_layout(layout, rank)
        else:
            members = _check_layout(layout, rank)
            dist.init_process_group(
                backend,
                init_method=init_method,
                rank=rank,
                world_size=len(members["world"]),
                timeout=wait,
            )
        world = members["world"]
        made: dict[tuple[int, ...], ProcessGroup | None] = {world: None}  # None: the default group
        handles: dict[str, ProcessGroup | None] = {}
        for name in GROUP_NAMES:
            for group in _groups_of(layout, name):
                if len(group) > 1 and group not in made:
                    made[group] = dist.new_group(list(group), timeout=wait, backend=backend)
            handles[name] = made.get(members[name])
        return cls(rank, members, handles, started=True)

    def rank(self, group: str = "world") -> int:
        """This rank's index within ``group`` (its place in ``ranks(group)``)."""
        return self.ranks(group).index(self._rank)

    def size(self, group: str = "world") -> int:
        return len(self.ranks(group))

    def ranks(self, group: str = "world") -> tuple[int, ...]:
        """The replica ranks that share ``group`` with this one, in group-rank order."""
        members = self._members.get(group)
        if members is None:
            raise InvalidRequest(
                f"group: unknown group {group!r}; known groups: {', '.join(GROUP_NAMES)}",
                {"field": "group", "group": group},
            )
        return members

    def all_reduce(self, tensor: torch.Tensor, group: str = "world") -> torch.Tensor:
        """Sum ``tensor`` over ``group``, in place; returns it."""
        if self.size(group) > 1:
            import torch.distributed as dist

            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self._handles[group])
        return tensor

    def all_gather(self, tensor: torch.Tensor, group: str = "world", dim: int = -1) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along ``dim``, in group-rank order."""
        size = self.size(group)
        if size == 1:
            return tensor
        import torch
        import torch.distributed as dist

        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(size)]
        dist.all_gather(parts, tensor, group=self._handles[group])
        return torch.cat(parts, dim=dim)

    def broadcast(self, tensor: torch.Tensor, src: int = 0, group: str = "world") -> torch.Tensor:
        """``tensor`` from the rank ``src`` of ``group`` (an index within the group), in place."""
        members = self.ranks(group)
        if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < len(members):
            raise InvalidRequest(
                f"src: expected a rank of group {group!r} in [0, {len(members)}), got {src!r}",
                {"field": "src", "group": group},
            )
        if len(members) > 1:
            import torch.distributed as dist

            dist.broadcast(tensor, src=members[src], group=self._handles[group])
        return tensor

    def barrier(self, group: str = "world") -> None:
        """Wait until every rank of ``group`` reaches here."""
        if self.size(group) > 1:
            import torch.distributed as dist

            dist.barrier(group=self._handles[group])

    def close(self) -> None:
        """Leave the replica's process groups (all of them); harmless twice and on ``single()``."""
        if self._started:
            import torch.distributed as dist

            self._started = False
            dist.destroy_process_group()

    def __repr__(self) -> str:
        sizes = ", ".join(f"{name}={len(self._members[name])}" for name in GROUP_NAMES)
        return f"Groups(rank={self._rank}, {sizes})"


def _groups_of(layout: Layout, name: str) -> list[tuple[int, ...]]:
    return [tuple(group) for group in layout[name]]


def _check_layout(layout: Layout, rank: int) -> dict[str, tuple[int, ...]]:
    """The group of each name that holds ``rank``, after checking each name partitions the ranks."""
    missing = [name for name in GROUP_NAMES if name not in layout]
    extra = sorted(set(layout) - set(GROUP_NAMES))
    if missing or extra:
        raise InvalidRequest(
            f"layout: expected exactly the groups {', '.join(GROUP_NAMES)}; "
            f"missing {missing}, unknown {extra}",
            {"field": "layout"},
        )
    world = _groups_of(layout, "world")
    if len(world) != 1 or sorted(world[0]) != list(range(len(world[0]))) or not world[0]:
        raise InvalidRequest(
            f"layout.world: expected one group of ranks 0..n-1, got {world}",
            {"field": "layout.world"},
        )
    everyone = list(range(len(world[0])))
    if isinstance(rank, bool) or not isinstance(rank, int) or rank not in everyone:
        raise InvalidRequest(
            f"rank: expected an int in [0, {len(everyone)}), got {rank!r}", {"field": "rank"}
        )
    members: dict[str, tuple[int, ...]] = {}
    for name in GROUP_NAMES:
        groups = _groups_of(layout, name)
        flat = [r for group in groups for r in group]
        if not all(groups) or len(flat) != len(everyone) or set(flat) != set(everyone):
            raise InvalidRequest(
                f"layout.{name}: expected groups that partition ranks 0..{len(everyone) - 1}, "
                f"got {groups}",
                {"field": f"layout.{name}"},
            )
        members[name] = next(group for group in groups if rank in group)
    return members
