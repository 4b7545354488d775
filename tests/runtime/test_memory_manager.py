"""ModelManager on a simulated device: placement, eviction, the re-run ladder, the registry."""

from __future__ import annotations

import math

import pytest
import torch
from small_models import Stack
from torch import nn

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.memory.stream import stage_bytes
from mizuoto_runtime.ops import init_random
from mizuoto_runtime.runtime import Runtime
from mizuoto_sdk.errors import ComputeUnavailable, InvalidRequest

WIDTH = 16


def handle(name: str = "m", blocks: int = 4, seed: int = 0) -> ModelHandle:
    model = init_random(Stack(blocks, WIDTH), torch.Generator().manual_seed(seed))
    return ModelHandle(model, name=name, load_device="cpu")


UNIT = handle().unit_parts[0].nbytes
SLOT = stage_bytes(handle().unit_parts[0])
BASE = handle().base.nbytes
FULL = BASE + 4 * UNIT
X = torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(5))


def simulated(total: int, **settings: object) -> Runtime:
    return Runtime(simulate={"cpu": total}, settings=settings or None)


def run(rt: Runtime, h: ModelHandle, phase: str = "forward", **kw) -> torch.Tensor:
    with torch.inference_mode():
        return rt.manager.run(phase, h.module, X, handles=[h], working_bytes=0, **kw)


def in_use(rt: Runtime) -> int:
    free, total = rt.devices.memory("cpu")
    return total - free


def row(rt: Runtime, name: str) -> dict[str, object]:
    return next(r for r in rt.manager.residency() if r["name"] == name)


def test_on_a_plain_cpu_nothing_moves_and_nothing_is_counted():
    rt = Runtime()
    h = handle()
    rt.manager.register([h], owner="m@cpu")
    expected = h.module(X)
    assert torch.equal(run(rt, h), expected)
    with rt.manager.use(h, phase="call"):
        assert row(rt, "m")["state"] == "busy"
    assert row(rt, "m")["state"] == "idle"
    assert (h.resident_bytes, h.streamed_bytes, h.host_bytes) == (h.size_bytes, 0, 0)
    assert rt.manager.release_idle("cpu") == [] and rt.manager.offload() == []


def test_a_model_that_fits_stays_resident_and_is_listed():
    rt = simulated(FULL + 100)
    h = handle()
    rt.manager.register([h], owner="m@cpu")
    assert torch.equal(run(rt, h), h.module(X))
    assert row(rt, "m") | {"last_used": 0} == {
        "name": "m",
        "owner": "m@cpu",
        "device": "cpu",
        "resident_bytes": FULL,
        "streamed_bytes": 0,
        "host_bytes": 0,
        "state": "idle",
        "last_used": 0,
    }
    assert in_use(rt) == FULL


def test_registering_more_than_fits_is_not_refused_the_rest_waits_in_host_memory():
    rt = simulated(BASE + 2 * UNIT)
    h = handle()
    rt.manager.register([h], owner="m@cpu")
    assert h.resident_bytes == BASE + 2 * UNIT and h.host_bytes == 2 * UNIT
    assert in_use(rt) == BASE + 2 * UNIT


def test_a_model_that_does_not_fit_streams_units_and_computes_the_same():
    rt = simulated(BASE + UNIT + 2 * SLOT)
    h = handle()
    expected = h.module(X)
    rt.manager.register([h], owner="m@cpu")
    assert torch.equal(run(rt, h), expected)
    assert h.resident_bytes == BASE + UNIT and h.streamed_bytes == 3 * UNIT
    assert in_use(rt) == BASE + UNIT + 2 * SLOT


def test_idle_models_give_memory_back_least_recently_used_first():
    rt = simulated(2 * FULL + 100)
    a, b, c = handle("a"), handle("b", seed=1), handle("c", seed=2)
    rt.manager.register([a], owner="a@cpu")
    rt.manager.register([b], owner="b@cpu")
    run(rt, a)
    run(rt, b)
    rt.manager.register([c], owner="c@cpu")  # waits in host memory: a and b fill the device
    run(rt, c)
    assert c.resident_bytes == FULL
    assert b.resident_bytes == FULL  # used more recently than a
    assert a.resident_bytes < FULL and a.host_bytes > 0
    assert in_use(rt) <= 2 * FULL + 100


def test_a_handle_in_use_is_never_evicted_the_other_model_streams_instead():
    rt = simulated(FULL + BASE + UNIT + 2 * SLOT)
    a, b = handle("a"), handle("b", seed=1)
    rt.manager.register([a, b], owner="ab@cpu")
    expected = b.module(X)
    with rt.manager.use(a, phase="hold", working_bytes=0):
        assert torch.equal(run(rt, b), expected)
        assert a.resident_bytes == FULL
        assert rt.manager.release_idle("cpu") == ["b"]
        assert a.resident_bytes == FULL
    assert b.streamed_bytes + b.host_bytes > 0


def test_an_injected_oom_releases_idle_models_and_reruns_exactly():
    rt = simulated(2 * FULL)
    h, idle = handle("m"), handle("idle", seed=1)
    rt.manager.register([idle], owner="idle@cpu")
    rt.manager.register([h], owner="m@cpu")
    calls = []

    def phase(ctx: RequestContext) -> torch.Tensor:
        noise = torch.rand(4, generator=ctx.generator_for("cpu"))
        calls.append(noise)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return noise

    ctx = RequestContext(seed=7, manager=rt.manager)
    result = ctx.run("sample", phase, ctx, handles=[h])
    clean = torch.rand(4, generator=RequestContext(seed=7).generator_for("cpu"))
    assert torch.equal(result, clean) and torch.equal(calls[0], calls[1])
    assert len(calls) == 2  # one failure, one re-run
    assert idle.resident_bytes == 0 and h.resident_bytes > 0
    assert row(rt, "idle")["host_bytes"] == FULL  # released, not unloaded


def test_working_memory_that_does_not_fit_is_retried_with_more_streaming_then_calibrated():
    rt = simulated(FULL + 2 * UNIT)
    h = handle()
    rt.manager.register([h], owner="m@cpu")
    activations = 3 * UNIT
    expected = h.module(X)
    attempts = []

    def forward(x: torch.Tensor) -> torch.Tensor:
        attempts.append(h.resident_bytes)
        rt.devices.meter("cpu").charge(activations)  # what the forward allocates on the device
        try:
            return h.module(x)
        finally:
            rt.devices.meter("cpu").charge(-activations)

    with torch.inference_mode():
        assert torch.equal(rt.manager.run("forward", forward, X, handles=[h]), expected)
    assert len(attempts) >= 2 and attempts[-1] < attempts[0]  # re-run with more streamed
    assert h.streamed_bytes > 0
    assert rt.devices.meter("cpu").peak() <= FULL + 2 * UNIT
    attempts.clear()
    with torch.inference_mode():
        assert torch.equal(rt.manager.run("forward", forward, X, handles=[h]), expected)
    assert len(attempts) == 1  # planned from the peak: no failed attempt


def test_an_oom_that_does_not_go_away_fails_with_compute_unavailable_after_the_ladder():
    h = handle(blocks=8)
    rt = simulated(2 * h.size_bytes)
    rt.manager.register([h], owner="m@cpu")
    calls = []

    def phase() -> None:
        calls.append(h.resident_bytes)
        raise torch.OutOfMemoryError("out of memory")

    with pytest.raises(ComputeUnavailable) as failure:
        rt.manager.run("forward", phase, handles=[h])
    error = failure.value
    assert error.code == "compute_unavailable"
    assert error.detail["reason"] == "out_of_memory" and error.detail["device"] == "cpu"
    assert calls[0] == h.size_bytes  # it fitted: the first attempt ran fully resident
    assert len(calls) <= math.log2(8) + 3
    assert calls == sorted(calls, reverse=True) and calls[-1] == BASE  # ends fully streamed
    assert row(rt, "m")["state"] == "idle"  # still registered, usable once memory is back


def test_errors_other_than_out_of_memory_propagate_at_once():
    rt = simulated(FULL + 100)
    h = handle()
    calls = []

    def phase() -> None:
        calls.append(1)
        raise KeyError("bad")

    with pytest.raises(KeyError):
        rt.manager.run("forward", phase, handles=[h])
    assert calls == [1]  # no re-run


def test_an_oom_inside_a_use_block_propagates_after_releasing_idle_models():
    rt = simulated(2 * FULL)
    a, b = handle("a"), handle("b", seed=1)
    rt.manager.register([a, b], owner="ab@cpu")
    with pytest.raises(torch.OutOfMemoryError), rt.manager.use(a, phase="call"):
        raise torch.OutOfMemoryError("out of memory")
    assert b.resident_bytes == 0 and a.resident_bytes == FULL


def test_unload_and_forget_give_memory_back_and_skip_busy_handles():
    rt = simulated(3 * FULL)
    a, b = handle("a"), handle("b", seed=1)
    rt.manager.register([a], owner="x@cpu")
    rt.manager.register([b], owner="y@cpu")
    with rt.manager.use(b):
        assert rt.manager.offload() == ["a"]
    assert a.resident_bytes == 0 and b.resident_bytes == FULL
    assert rt.manager.offload("y@cpu") == ["b"]
    assert rt.manager.offload("nobody") == []
    run(rt, b)
    assert rt.manager.forget("y@cpu") == ["b"]
    assert in_use(rt) == 0
    assert [r["name"] for r in rt.manager.residency()] == ["a"]


def test_release_idle_gives_back_every_idle_byte_on_the_device():
    rt = simulated(3 * FULL)
    a = handle("a")
    rt.manager.register([a], owner="a@cpu")
    assert rt.manager.release_idle("cpu") == ["a"]
    assert in_use(rt) == 0


def test_headroom_and_staging_slots_come_from_the_settings():
    h = handle()
    rt = simulated(FULL + 100, **{"compute.vram_headroom_mb": 0.5 * (FULL + 100) / 2**20})
    rt.manager.register([h], owner="m@cpu")
    run(rt, h)
    assert h.streamed_bytes > 0
    h = handle()
    rt = simulated(BASE + 3 * SLOT, **{"compute.stream_in_flight": 1})
    rt.manager.register([h], owner="m@cpu")
    run(rt, h)
    assert rt.manager.streamer("cpu").staging_bytes == SLOT


@pytest.mark.parametrize(
    "settings",
    [
        {"compute.vram_headroom_mb": -1},
        {"compute.stream_in_flight": 0},
        {"compute.working_margin": "x"},
    ],
)
def test_bad_memory_settings_are_invalid_requests_naming_the_key(settings: dict[str, object]):
    with pytest.raises(InvalidRequest) as failure:
        simulated(FULL, **settings)
    assert failure.value.detail["field"] == next(iter(settings))


def test_the_simulated_vram_setting_makes_the_cpu_play_a_gpu():
    rt = Runtime(settings={"compute.simulate_vram_mb": 1})
    assert rt.devices.is_accelerator("cpu") and rt.devices.memory("cpu") == (2**20, 2**20)
    with pytest.raises(InvalidRequest, match=r"compute\.simulate_vram_mb"):
        Runtime(settings={"compute.simulate_vram_mb": 0})


def test_a_context_without_a_manager_just_runs():
    ctx = RequestContext(seed=1)
    h = handle()
    with ctx.use(h, phase="call"):
        pass
    assert ctx.run("forward", lambda x: x + 1, 1, handles=[h]) == 2


def test_a_simulated_device_fails_an_allocation_over_its_total_and_keeps_a_peak():
    devices = Runtime(simulate={"cpu": 1000}).devices
    devices.meter("cpu").charge(600)
    with pytest.raises(torch.OutOfMemoryError, match="simulated cpu"):
        devices.meter("cpu").charge(500)
    assert devices.memory("cpu") == (400, 1000)  # the failed allocation counted nothing
    devices.meter("cpu").charge(-600)
    assert devices.meter("cpu").peak() == 600
    devices.meter("cpu").reset_peak()
    assert devices.meter("cpu").peak() == 0


def test_a_held_handle_is_busy_between_phases_and_placed_from_any_thread():
    import threading

    rt = simulated(3 * FULL)
    a, b = handle("a"), handle("b", seed=1)
    rt.manager.register([a, b], owner="x@cpu")
    expected = a.module(X)
    with rt.manager.hold(a):
        assert row(rt, "a")["state"] == "busy"
        assert rt.manager.release_idle("cpu") == ["b"]
        assert a.resident_bytes == FULL
        outputs = []
        worker = threading.Thread(target=lambda: outputs.append(run(rt, a)))
        worker.start()
        worker.join()
        assert torch.equal(outputs[0], expected)
    assert row(rt, "a")["state"] == "idle"
    assert rt.manager.release_idle("cpu") == ["a"]


def test_a_module_is_found_by_its_handle_and_a_stranger_is_refused():
    rt = simulated(3 * FULL)
    a = handle("a")
    rt.manager.register([a], owner="a@cpu")
    with rt.manager.use(a.module):
        assert row(rt, "a")["state"] == "busy"
    stranger = nn.Linear(2, 2)
    with (
        pytest.raises(TypeError, match="not a ModelHandle nor a module the host manages"),
        rt.manager.hold(stranger),
    ):
        pass


def test_the_previous_names_warn_and_still_work():
    rt = simulated(3 * FULL)
    a = handle("a")
    rt.manager.register([a], owner="a@cpu")
    with pytest.warns(DeprecationWarning, match="resident_bytes"):
        assert a.loaded_bytes == FULL
    with pytest.warns(DeprecationWarning, match="residency"):
        assert [r["name"] for r in rt.manager.loaded()] == ["a"]
    with pytest.warns(DeprecationWarning, match="offload"):
        assert rt.manager.unload() == ["a"]
    with pytest.warns(DeprecationWarning, match="charge"):
        rt.devices.account("cpu", 10)
    assert in_use(rt) == 10
