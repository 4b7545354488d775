"""Properties of the memory manager over model sizes, unit counts and budgets (simulated VRAM).

- the device's accounted bytes never exceed its budget, and always equal what the handles
  hold resident plus the staging slots;
- more budget never leaves fewer bytes resident;
- the re-run ladder always ends, within its bound;
- a handle in use is never evicted;
- whatever the placement, a phase computes what the resident model computes.
"""

from __future__ import annotations

import contextlib
import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from small_models import Stack

from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.ops import init_random
from mizuoto_runtime.runtime import Runtime
from mizuoto_sdk.errors import ComputeUnavailable

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make(name: str, blocks: int, width: int) -> ModelHandle:
    model = init_random(Stack(blocks, width), torch.Generator().manual_seed(blocks * 31 + width))
    return ModelHandle(model, name=name, load_device="cpu")


models = st.lists(st.tuples(st.integers(1, 6), st.sampled_from([4, 8, 12])), min_size=1, max_size=3)


def consistent(rt: Runtime, handles: list[ModelHandle]) -> None:
    free, total = rt.devices.memory("cpu")
    staging = rt.manager.streamer("cpu").staging_bytes
    assert total - free == sum(h.resident_bytes for h in handles) + staging
    assert rt.devices.meter("cpu").peak() <= total


def forward(rt: Runtime, h: ModelHandle, activations: int) -> torch.Tensor:
    width = h.module.blocks[0].in_features
    x = torch.linspace(-1, 1, 3 * width).view(3, width)

    def phase() -> torch.Tensor:
        rt.devices.meter("cpu").charge(activations)
        try:
            return h.module(x)
        finally:
            rt.devices.meter("cpu").charge(-activations)

    with torch.inference_mode():
        return rt.manager.run("forward", phase, handles=[h], working_bytes=activations)


@SETTINGS
@given(
    shapes=models,
    budget_share=st.floats(0.05, 1.5),
    phases=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4000)), min_size=1, max_size=6),
)
def test_accounting_stays_within_budget_and_outputs_stay_exact(shapes, budget_share, phases):
    handles = [make(f"m{i}", blocks, width) for i, (blocks, width) in enumerate(shapes)]
    expected = {}
    for h in handles:
        width = h.module.blocks[0].in_features
        with torch.inference_mode():
            expected[h.name] = h.module(torch.linspace(-1, 1, 3 * width).view(3, width))
    total = max(1, int(sum(h.size_bytes for h in handles) * budget_share))
    rt = Runtime(simulate={"cpu": total})
    for count, h in enumerate(handles, 1):
        rt.manager.register([h], owner=f"{h.name}@cpu")
        consistent(rt, handles[:count])
    for which, activations in phases:
        h = handles[which % len(handles)]
        try:
            out = forward(rt, h, activations)
        except ComputeUnavailable as error:
            assert error.detail["reason"] == "out_of_memory"
        else:
            assert torch.equal(out, expected[h.name])
        consistent(rt, handles)


@SETTINGS
@given(
    blocks=st.integers(1, 8),
    width=st.sampled_from([4, 8, 16]),
    budgets=st.lists(st.integers(1, 20_000), min_size=2, max_size=4),
    idle=st.booleans(),
)
def test_more_budget_never_leaves_fewer_bytes_resident(blocks, width, budgets, idle):
    resident = []
    for budget in sorted(budgets):
        h, other = make("m", blocks, width), make("other", 2, width)
        rt = Runtime(simulate={"cpu": budget})
        if idle:
            rt.manager.register([other], owner="other@cpu")
        rt.manager.register([h], owner="m@cpu")
        with contextlib.suppress(ComputeUnavailable):
            forward(rt, h, 0)
        resident.append(h.resident_bytes)
    assert resident == sorted(resident)


@SETTINGS
@given(blocks=st.integers(1, 12), width=st.sampled_from([4, 8, 16]), share=st.floats(0.1, 3))
def test_the_ladder_always_ends_within_its_bound(blocks, width, share):
    h = make("m", blocks, width)
    rt = Runtime(simulate={"cpu": max(1, int(h.size_bytes * share))})
    rt.manager.register([h], owner="m@cpu")
    calls = []

    def phase() -> None:
        calls.append(h.resident_bytes)
        raise torch.OutOfMemoryError("out of memory")

    try:
        rt.manager.run("forward", phase, handles=[h], working_bytes=0)
    except ComputeUnavailable as error:
        assert error.detail["reason"] == "out_of_memory"
    else:
        raise AssertionError("a phase that always fails cannot succeed")
    assert len(calls) <= math.ceil(math.log2(blocks + 1)) + 4
    assert calls == sorted(calls, reverse=True)
    consistent(rt, [h])


@SETTINGS
@given(
    shapes=st.lists(st.tuples(st.integers(1, 5), st.sampled_from([4, 8])), min_size=2, max_size=3),
    share=st.floats(0.3, 2),
    phases=st.lists(st.tuples(st.integers(1, 2), st.integers(0, 3000)), min_size=1, max_size=5),
)
def test_a_handle_in_use_is_never_evicted(shapes, share, phases):
    handles = [make(f"m{i}", blocks, width) for i, (blocks, width) in enumerate(shapes)]
    rt = Runtime(simulate={"cpu": max(1, int(sum(h.size_bytes for h in handles) * share))})
    rt.manager.register(handles, owner="all@cpu")
    held = handles[0]
    try:
        with rt.manager.use(held, phase="hold", working_bytes=0):
            states = [p.state for p in held.parts]
            for which, activations in phases:
                with contextlib.suppress(ComputeUnavailable):
                    forward(rt, handles[1 + which % (len(handles) - 1)], activations)
                assert [p.state for p in held.parts] == states
                rt.manager.release_idle("cpu")
                rt.manager.offload()
                assert [p.state for p in held.parts] == states
    except ComputeUnavailable:
        pass  # the held model itself did not fit
    consistent(rt, handles)
