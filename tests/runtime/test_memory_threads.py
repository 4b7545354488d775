"""Many threads calling many models on one simulated device: as if each call ran alone.

Properties, over threads x models x budgets x staging slots x cancels:

- every call returns, bit for bit, what the resident model computes alone, or (a cancelled
  call) ``CancelledError``; never another error, never "every staging slot is in use";
- afterwards every weight is what it was, every unit's tensors are back on their host copy
  or resident, and the device's counter equals what the handles hold plus the slots.

Plus the case that broke it: a unit entered twice at once (two threads running one model)
kept the staging view as its host copy, so refilling the slot changed the model's weights.
"""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from small_models import Stack

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.devices.device import DeviceService
from mizuoto_runtime.lm import QwenConfig, QwenDecoder
from mizuoto_runtime.memory.handle import STREAMED, ModelHandle
from mizuoto_runtime.memory.stream import Streamer, stage_bytes
from mizuoto_runtime.ops import init_random
from mizuoto_runtime.runtime import Runtime
from mizuoto_sdk.errors import CancelledError

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def qwen(layers: int) -> QwenDecoder:
    """A decoder whose layers stream through forward hooks."""
    config = QwenConfig.from_dict(
        {
            "model_type": "qwen3",
            "vocab_size": 37,
            "hidden_size": 16,
            "intermediate_size": 24,
            "num_hidden_layers": layers,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 8,
        }
    )
    return QwenDecoder(config)


def make(index: int, kind: str, blocks: int) -> ModelHandle:
    model = Stack(blocks, 8 + 4 * index) if kind == "stack" else qwen(blocks)
    init_random(model, torch.Generator().manual_seed(100 * index + blocks))
    return ModelHandle(model, name=f"m{index}", load_device="cpu", kind="oneshot")


def inputs(handle: ModelHandle, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if isinstance(handle.module, Stack):
        width = handle.module.blocks[0].in_features
        return torch.randn(3, width, generator=generator)
    return torch.randint(0, 37, (1, 5), generator=generator)


def compute(handle: ModelHandle, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return handle.module(x)


models = st.lists(
    st.tuples(st.sampled_from(["stack", "qwen"]), st.integers(2, 5)), min_size=1, max_size=3
)
# Per thread: calls of (model, input seed, cancelled by another thread at some moment).
plans = st.lists(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 3), st.booleans()), min_size=1, max_size=4
    ),
    min_size=2,
    max_size=4,
)


@SETTINGS
@given(models=models, plans=plans, extra=st.floats(0, 1.2), in_flight=st.integers(1, 3))
def test_concurrent_calls_compute_what_serial_calls_compute_and_change_no_weight(
    models, plans, extra, in_flight
):
    handles = [make(i, kind, blocks) for i, (kind, blocks) in enumerate(models)]
    weights = [{k: v.clone() for k, v in h.module.state_dict().items()} for h in handles]
    expected = {
        (m, seed): compute(handles[m], inputs(handles[m], seed))
        for m in range(len(handles))
        for seed in range(4)
    }
    slot = max(stage_bytes(p) for h in handles for p in h.unit_parts)
    units = sum(p.nbytes for h in handles for p in h.unit_parts)
    # Room for the largest model's base and the slots, and a share of every unit besides.
    budget = max(h.base.nbytes for h in handles) + in_flight * slot + int(extra * units)
    settings_ = {"compute.stream_in_flight": in_flight}
    rt = Runtime(simulate={"cpu": budget}, settings=settings_)
    for h in handles:
        rt.manager.register([h], owner=h.name)

    contexts = [[RequestContext(seed=0, manager=rt.manager) for _ in plan] for plan in plans]
    cancelled = [
        ctx
        for plan, row in zip(plans, contexts, strict=True)
        for (_, _, flagged), ctx in zip(plan, row, strict=True)
        if flagged
    ]
    start = threading.Barrier(len(plans) + 1)
    failures: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            start.wait()
            for (model, seed, _), ctx in zip(plans[index], contexts[index], strict=True):
                handle = handles[model % len(handles)]
                x = inputs(handle, seed)
                try:
                    with ctx.bind():
                        out = ctx.run("forward", compute, handle, x, handles=[handle])
                except CancelledError:
                    assert ctx in cancelled
                    continue
                assert torch.equal(out, expected[(model % len(handles), seed)])
        except BaseException as error:  # handed to the main thread
            failures.append(error)

    def canceller() -> None:  # each cancel lands wherever the calls are: before, in or after
        start.wait()
        for ctx in cancelled:
            ctx.cancel()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(plans))]
    threads.append(threading.Thread(target=canceller))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, repr(failures[0])

    streamer = rt.manager.streamer("cpu")
    for h, before in zip(handles, weights, strict=True):
        for name, tensor in h.module.state_dict().items():
            assert torch.equal(tensor, before[name]), f"{h.name}.{name} changed"
    free, total = rt.devices.memory("cpu")
    assert total - free == sum(h.resident_bytes for h in handles) + streamer.staging_bytes
    for index, h in enumerate(handles):  # serial calls after: still exact
        for seed in range(2):
            out = rt.manager.run("forward", compute, h, inputs(h, seed), handles=[h])
            assert torch.equal(out, expected[(index, seed)])


def test_a_unit_entered_twice_at_once_keeps_its_weights():
    model = init_random(Stack(4, 8), torch.Generator().manual_seed(3))
    handle = ModelHandle(model, name="stack", load_device="cpu")
    for part in handle.unit_parts:
        handle.move(part, STREAMED)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    streamer = Streamer(DeviceService(simulate={"cpu": 1 << 20}).meter("cpu"))
    streamer.configure(2, stage_bytes(handle.unit_parts[0]))
    streamer.attach(handle)
    first, last = handle.unit_parts[0], handle.unit_parts[3]
    streamer.enter(first)
    streamer.enter(first)  # a second runner of the same unit, as another thread would be
    streamer.exit(first)
    streamer.exit(first)
    for part in (last, handle.unit_parts[1], handle.unit_parts[2]):  # refill every slot
        streamer.enter(part)
        streamer.exit(part)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name


def test_an_exit_without_an_enter_on_that_thread_leaves_the_unit_to_its_runner():
    model = init_random(Stack(2, 8), torch.Generator().manual_seed(4))
    handle = ModelHandle(model, name="stack", load_device="cpu")
    part = handle.unit_parts[0]
    handle.move(part, STREAMED)
    host = model.blocks[0].weight.data_ptr()
    streamer = Streamer(DeviceService(simulate={"cpu": 1 << 20}).meter("cpu"))
    streamer.configure(1, stage_bytes(part))
    streamer.attach(handle)
    streamer.enter(part)
    other = threading.Thread(target=streamer.exit, args=(part,))  # its enter had failed
    other.start()
    other.join()
    assert model.blocks[0].weight.data_ptr() != host  # still staged for its runner
    streamer.exit(part)
    assert model.blocks[0].weight.data_ptr() == host


def test_a_call_waiting_for_a_slot_gets_it_when_the_runner_leaves():
    model = init_random(Stack(2, 8), torch.Generator().manual_seed(5))
    handle = ModelHandle(model, name="stack", load_device="cpu")
    first, second = handle.unit_parts
    handle.move(first, STREAMED)
    handle.move(second, STREAMED)
    streamer = Streamer(DeviceService(simulate={"cpu": 1 << 20}).meter("cpu"))
    streamer.configure(1, stage_bytes(first))
    streamer.attach(handle)
    streamer.enter(first)
    entered = threading.Event()

    def run_second() -> None:
        streamer.enter(second)  # waits: the one slot is in use
        entered.set()
        streamer.exit(second)

    waiter = threading.Thread(target=run_second)
    waiter.start()
    streamer.exit(first)
    waiter.join()
    assert entered.is_set()


def test_a_call_waiting_for_a_slot_stops_when_it_is_cancelled():
    model = init_random(Stack(2, 8), torch.Generator().manual_seed(6))
    handle = ModelHandle(model, name="stack", load_device="cpu")
    first, second = handle.unit_parts
    handle.move(first, STREAMED)
    handle.move(second, STREAMED)
    streamer = Streamer(DeviceService(simulate={"cpu": 1 << 20}).meter("cpu"))
    streamer.configure(1, stage_bytes(first))
    streamer.attach(handle)
    streamer.enter(first)
    ctx = RequestContext(seed=0)
    errors: list[BaseException] = []

    def run_second() -> None:
        with ctx.bind():
            try:
                streamer.enter(second)
            except CancelledError as error:
                errors.append(error)

    waiter = threading.Thread(target=run_second)
    waiter.start()
    ctx.cancel()
    waiter.join()
    assert len(errors) == 1
    streamer.exit(first)


class Watched(RequestContext):
    """A call's context that says when the streamer first checks it: the call is waiting."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.waiting = threading.Event()

    def check_cancel(self) -> None:
        self.waiting.set()
        super().check_cancel()


def test_two_calls_waiting_for_the_same_unit_share_it_and_keep_its_weights():
    model = init_random(Stack(3, 8), torch.Generator().manual_seed(8))
    handle = ModelHandle(model, name="stack", load_device="cpu")
    for part in handle.unit_parts:
        handle.move(part, STREAMED)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    first, middle, last = handle.unit_parts
    streamer = Streamer(DeviceService(simulate={"cpu": 1 << 20}).meter("cpu"))
    streamer.configure(2, stage_bytes(first))
    streamer.attach(handle)
    streamer.enter(first)
    streamer.enter(last)  # both slots in use: the calls below wait
    together = threading.Barrier(2, timeout=10)
    contexts = [Watched(), Watched()]
    errors: list[BaseException] = []

    def run_middle(ctx: Watched) -> None:
        try:
            with ctx.bind():
                streamer.enter(middle)
            together.wait()  # both run the unit at once
            streamer.exit(middle)
        except BaseException as error:  # handed to the main thread
            errors.append(error)

    threads = [threading.Thread(target=run_middle, args=(ctx,)) for ctx in contexts]
    for thread in threads:
        thread.start()
    for ctx in contexts:
        assert ctx.waiting.wait(10)
    streamer.exit(first)  # one slot frees: one call stages the unit, the other joins it
    for thread in threads:
        thread.join()
    streamer.exit(last)
    assert not errors, repr(errors[0])
    for part in (first, last, middle):  # refill the slots
        streamer.enter(part)
        streamer.exit(part)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name


def test_units_nested_in_units_with_too_few_slots_fail_at_once_naming_the_setting():
    model = init_random(Stack(2, 8), torch.Generator().manual_seed(7))
    handle = ModelHandle(model, name="stack", load_device="cpu")
    first, second = handle.unit_parts
    handle.move(first, STREAMED)
    handle.move(second, STREAMED)
    streamer = Streamer(DeviceService(simulate={"cpu": 1 << 20}).meter("cpu"))
    streamer.configure(1, stage_bytes(first))
    streamer.attach(handle)
    streamer.enter(first)
    with pytest.raises(RuntimeError, match="stream_in_flight"):
        streamer.enter(second)
    streamer.exit(first)
