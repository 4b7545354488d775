"""Groups: named process groups over real gloo ranks (2 and 4 processes), and the single-rank case.

Each rank records what its groups told it; the test checks those records against values worked
out here from the rank numbers alone.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.parallel import Groups
from mizuoto_runtime.runtime import Runtime
from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.parallel import GROUP_NAMES

CHECKED = ("world", "dense_tp", "dense_dp", "attention_tp", "moe_ep")


def _layout(world: int, **split: list[list[int]]) -> dict[str, list[list[int]]]:
    layout = {name: [[rank] for rank in range(world)] for name in GROUP_NAMES}
    layout["world"] = [list(range(world))]
    layout.update(split)
    return layout


FOUR = _layout(
    4,
    dense_tp=[[0, 1], [2, 3]],
    dense_dp=[[0, 2], [1, 3]],
    attention_tp=[[0, 1], [2, 3]],  # the same ranks as dense_tp
    attention_dp=[[0, 2], [1, 3]],
)
TWO = _layout(2, dense_tp=[[0, 1]], cfg=[[0, 1]])  # dense_tp is the whole world


def _rank_main(rank: int, layout: dict, init_method: str, out: str) -> None:
    """One rank: every rank runs the same collectives in the same order."""
    groups = Groups.start(layout, rank, init_method=init_method, timeout=30.0)
    seen: dict[str, object] = {}
    try:
        for name in CHECKED:
            value = torch.tensor([rank + 1.0, 10.0 * (rank + 1)])
            summed = groups.all_reduce(value, group=name)
            gathered = groups.all_gather(torch.tensor([[rank, -rank]]), group=name)
            stacked = groups.all_gather(torch.tensor([[rank]]), group=name, dim=0)
            last = groups.size(name) - 1
            sent = groups.broadcast(torch.tensor([100.0 * rank]), src=last, group=name)
            groups.barrier(name)
            seen[name] = {
                "rank": groups.rank(name),
                "size": groups.size(name),
                "ranks": list(groups.ranks(name)),
                "all_reduce": summed.tolist(),
                "in_place": summed is value,
                "all_gather": gathered.tolist(),
                "all_gather_dim0": stacked.tolist(),
                "broadcast": sent.tolist(),
            }
        try:
            groups.size("tensor_parallel")
        except InvalidRequest as error:
            seen["unknown"] = str(error)
    finally:
        groups.close()
    Path(out, f"{rank}.json").write_text(json.dumps(seen))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_ranks(layout: dict, out: Path) -> dict[int, dict]:
    world = len(layout["world"][0])
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    context = mp.spawn(_rank_main, args=(layout, init_method, str(out)), nprocs=world, join=False)
    deadline = time.monotonic() + 90
    while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the {world} ranks did not finish within 90 s")
    return {rank: json.loads((out / f"{rank}.json").read_text()) for rank in range(world)}


@pytest.fixture(scope="module", params=[FOUR, TWO], ids=["4-ranks", "2-ranks"])
def replica(request, tmp_path_factory):
    layout = request.param
    return layout, _run_ranks(layout, tmp_path_factory.mktemp("ranks"))


def _group_of(layout: dict, name: str, rank: int) -> list[int]:
    return next(list(group) for group in layout[name] if rank in group)


def test_each_rank_sees_its_groups_by_name(replica):
    layout, seen = replica
    for rank, record in seen.items():
        for name in CHECKED:
            members = _group_of(layout, name, rank)
            assert record[name]["ranks"] == members
            assert record[name]["size"] == len(members)
            assert record[name]["rank"] == members.index(rank)


def test_collectives_combine_exactly_the_group_members(replica):
    layout, seen = replica
    for rank, record in seen.items():
        for name in CHECKED:
            members = _group_of(layout, name, rank)
            got = record[name]
            assert got["all_reduce"] == [
                float(sum(r + 1 for r in members)),
                float(sum(10 * (r + 1) for r in members)),
            ]
            assert got["in_place"]
            assert got["all_gather"] == [[v for r in members for v in (r, -r)]]
            assert got["all_gather_dim0"] == [[r] for r in members]
            assert got["broadcast"] == [100.0 * members[-1]]


def test_an_unknown_group_name_is_refused_naming_the_known_ones(replica):
    _, seen = replica
    for record in seen.values():
        assert "'tensor_parallel'" in record["unknown"]
        assert "dense_tp" in record["unknown"] and "moe_dp" in record["unknown"]


def test_single_is_rank_zero_of_one_and_touches_no_global_state():
    groups = Groups.single()
    x = torch.arange(4.0)
    for name in GROUP_NAMES:
        assert (groups.rank(name), groups.size(name), groups.ranks(name)) == (0, 1, (0,))
        assert groups.all_reduce(x, group=name) is x
        assert groups.all_gather(x, group=name) is x
        assert groups.broadcast(x, group=name) is x
        groups.barrier(name)
    assert torch.equal(x, torch.arange(4.0))
    groups.close()
    assert not dist.is_initialized()
    with pytest.raises(InvalidRequest, match="unknown group 'tp'") as caught:
        groups.rank("tp")
    assert caught.value.detail["field"] == "group"
    with pytest.raises(InvalidRequest, match=r"src: expected a rank of group 'world' in \[0, 1\)"):
        groups.broadcast(x, src=1)


@pytest.mark.parametrize(
    ("layout", "rank", "field"),
    [
        ({k: v for k, v in FOUR.items() if k != "cfg"}, 0, "layout"),
        ({**FOUR, "tensor": [[0, 1, 2, 3]]}, 0, "layout"),
        ({**FOUR, "world": [[0, 1], [2, 3]]}, 0, "layout.world"),
        ({**FOUR, "dense_tp": [[0, 1], [1, 2, 3]]}, 0, "layout.dense_tp"),
        ({**FOUR, "moe_ep": [[0, 1], [2]]}, 0, "layout.moe_ep"),
        (FOUR, 4, "rank"),
    ],
    ids=["missing", "unknown", "split-world", "overlap", "short", "rank"],
)
def test_a_bad_layout_is_refused_before_any_process_group(layout, rank, field):
    with pytest.raises(InvalidRequest) as caught:
        Groups.start(layout, rank, init_method="tcp://127.0.0.1:1")
    assert caught.value.detail["field"] == field
    assert not dist.is_initialized()


def test_the_context_and_the_runtime_hand_out_single_groups_unless_given_others():
    assert RequestContext().parallel.size("dense_tp") == 1
    given = Groups.single()
    assert RequestContext(parallel=given).parallel is given
    with pytest.raises(TypeError, match="parallel: expected Groups"):
        RequestContext(parallel="tp=2")  # type: ignore[arg-type]  # the wrong type on purpose
    runtime = Runtime()
    assert runtime.parallel.size() == 1
    runtime.parallel = given
    assert runtime.parallel is given
    with pytest.raises(TypeError, match="parallel: expected Groups"):
        runtime.parallel = None  # type: ignore[assignment]  # the wrong type on purpose


def _nccl_rank(rank: int, init_method: str, out: str) -> None:
    """One NCCL rank on its own GPU: dense_tp all-reduce of CUDA tensors."""
    torch.cuda.set_device(rank)
    groups = Groups.start(TWO, rank, init_method=init_method, backend="nccl", timeout=60.0)
    try:
        summed = groups.all_reduce(torch.full((4,), rank + 1.0, device="cuda"), group="dense_tp")
        Path(out, f"{rank}.json").write_text(json.dumps(summed.cpu().tolist()))
    finally:
        groups.close()


@pytest.mark.cuda
def test_nccl_groups_reduce_cuda_tensors_across_two_gpus(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    init = f"tcp://127.0.0.1:{_free_port()}"
    mp.start_processes(_nccl_rank, args=(init, str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in range(2):
        assert json.loads((tmp_path / f"{rank}.json").read_text()) == [3.0] * 4
