"""Streamer on a simulated device: staging slots are counted and reused, units are copied ahead."""

from __future__ import annotations

import pytest
import torch
from small_models import HostCopies, Stack
from torch import nn

from mizuoto_runtime.devices.device import DeviceService
from mizuoto_runtime.memory.handle import STREAMED, ModelHandle
from mizuoto_runtime.memory.stream import Streamer, stage_bytes
from mizuoto_runtime.ops import init_random

WIDTH = 16


def stack(blocks: int = 4) -> Stack:
    return init_random(Stack(blocks, WIDTH), torch.Generator().manual_seed(0))


def streamed(blocks: int = 4, which: tuple[int, ...] = (1, 3)):
    model = stack(blocks)
    handle = ModelHandle(model, name="stack", load_device="cpu")
    for index in which:
        handle.move(handle.unit_parts[index], STREAMED)
    devices = DeviceService(simulate={"cpu": 1 << 20})
    return model, handle, devices, Streamer(devices.meter("cpu"))


def test_slots_are_counted_on_the_device_and_reused_when_the_plan_repeats():
    _, handle, devices, streamer = streamed()
    size = stage_bytes(handle.unit_parts[1])
    assert streamer.configure(2, size) == 2 * size
    assert devices.memory("cpu")[0] == (1 << 20) - 2 * size
    assert streamer.configure(2, size) == 0  # same plan: nothing allocated again
    assert streamer.configure(1, size) == -size
    assert streamer.release() == size
    assert devices.memory("cpu") == (1 << 20, 1 << 20)


def test_slots_that_do_not_fit_fail_as_a_real_allocation_would():
    _, handle, _, _ = streamed()
    devices = DeviceService(simulate={"cpu": 100})
    with pytest.raises(torch.OutOfMemoryError):
        Streamer(devices.meter("cpu")).configure(2, stage_bytes(handle.unit_parts[1]))
    assert devices.memory("cpu") == (100, 100)


def test_a_streamed_unit_runs_from_a_staged_copy_and_gets_its_host_tensor_back():
    model, handle, _, streamer = streamed()
    part = handle.unit_parts[1]
    weight = model.blocks[1].weight
    host = weight.data_ptr()
    seen = {}

    def record(module: nn.Module, args: object, out: object) -> None:
        seen["ptr"] = module.weight.data_ptr()

    model.blocks[1].register_forward_hook(record)
    streamer.configure(2, stage_bytes(part))
    streamer.attach(handle)
    x = torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        out = model(x)
    assert seen["ptr"] != host  # ran from the slot
    assert weight.data_ptr() == host and model.blocks[1].weight is weight
    streamer.detach(handle)
    with torch.inference_mode():
        assert torch.equal(model(x), out)


def test_the_next_streamed_unit_is_copied_while_one_runs_and_staged_units_are_reused():
    model, handle, _, streamer = streamed(which=(0, 1, 3))
    streamer.configure(2, stage_bytes(handle.unit_parts[1]))
    streamer.attach(handle)
    x = torch.zeros(1, WIDTH)
    with torch.inference_mode(), HostCopies(handle.unit_parts) as copies:
        model(x)
        # Each streamed unit, plus the first one again, prefetched while the last one ran.
        assert copies.count == 4
        model(x)
        assert copies.count == 7  # three streamed units through two slots: three copies a pass
    model, handle, _, streamer = streamed(which=(2,))
    streamer.configure(2, stage_bytes(handle.unit_parts[2]))
    streamer.attach(handle)
    with torch.inference_mode(), HostCopies(handle.unit_parts) as copies:
        for _ in range(3):
            model(x)
    assert copies.count == 1  # a lone streamed unit stays staged


def test_one_slot_streams_without_prefetch_and_gives_the_same_output():
    model, handle, _, streamer = streamed(which=(0, 1, 2, 3))
    x = torch.randn(3, WIDTH, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        expected = model(x)
    streamer.configure(1, stage_bytes(handle.unit_parts[0]))
    streamer.attach(handle)
    with torch.inference_mode(), HostCopies(handle.unit_parts) as copies:
        assert torch.equal(model(x), expected)
    assert copies.count == 4


def test_an_exception_inside_a_streamed_unit_still_restores_its_host_tensor():
    model, handle, _, streamer = streamed(which=(1,))
    weight = model.blocks[1].weight
    host = weight.data_ptr()
    streamer.configure(2, stage_bytes(handle.unit_parts[1]))
    streamer.attach(handle)

    def boom(module, args):
        raise RuntimeError("boom")

    hook = model.blocks[1].register_forward_pre_hook(boom)
    with pytest.raises(RuntimeError, match="boom"):
        model(torch.zeros(1, WIDTH))
    hook.remove()
    assert weight.data_ptr() == host
