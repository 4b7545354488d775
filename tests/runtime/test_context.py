"""RequestContext: seeded generators that match torch's global stream, cancel, progress, report."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from mizuoto_runtime.context import RequestContext, current_context
from mizuoto_sdk import CancelledError, EngineError, OperationTimeoutError


@pytest.fixture
def global_rng():
    state = torch.get_rng_state()
    yield
    torch.set_rng_state(state)


@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3])
def test_generator_for_replays_what_torch_manual_seed_would_draw(seed, global_rng):
    ctx = RequestContext(seed=seed)
    generator = ctx.generator_for("cpu")
    ours = [
        torch.rand(5, generator=generator),
        torch.randn(3, 4, generator=generator),
        torch.empty(6).exponential_(generator=generator),
        torch.multinomial(torch.tensor([0.2, 0.3, 0.5]), 4, True, generator=generator),
    ]
    torch.manual_seed(seed)
    reference = [
        torch.rand(5),
        torch.randn(3, 4),
        torch.empty(6).exponential_(),
        torch.multinomial(torch.tensor([0.2, 0.3, 0.5]), 4, True),
    ]
    for mine, theirs in zip(ours, reference, strict=True):
        assert torch.equal(mine, theirs)
    assert torch.equal(generator.get_state(), torch.get_rng_state())


def test_generator_for_returns_one_stream_per_device_and_leaves_the_global_alone():
    ctx = RequestContext(seed=1)
    before = torch.get_rng_state()
    assert ctx.generator_for("cpu") is ctx.generator_for(torch.device("cpu"))
    torch.rand(10, generator=ctx.generator_for("cpu"))
    assert torch.equal(before, torch.get_rng_state())


def test_rng_is_a_seeded_numpy_generator():
    a, b = RequestContext(seed=5).rng.random(4), RequestContext(seed=5).rng.random(4)
    assert np.array_equal(a, b)
    assert np.array_equal(a, np.random.default_rng(5).random(4))


def test_an_unseeded_context_picks_and_records_a_seed():
    ctx = RequestContext()
    assert ctx.applied["seed"] == ctx.seed and 0 <= ctx.seed < 2**63


@pytest.mark.parametrize("seed", [-1, 2**63, 1.5, "7", True])
def test_bad_seeds_are_invalid_requests_naming_the_field(seed):
    with pytest.raises(EngineError) as caught:
        RequestContext(seed=seed)
    assert caught.value.code == "invalid_request" and caught.value.detail["field"] == "params.seed"


def test_check_cancel_raises_the_error_for_the_reason():
    ctx = RequestContext(seed=0)
    ctx.check_cancel()
    ctx.cancel()
    with pytest.raises(CancelledError):
        ctx.check_cancel()
    timed_out = RequestContext(seed=0)
    timed_out.cancel("timeout")
    timed_out.cancel("cancelled")  # the first reason stands
    with pytest.raises(OperationTimeoutError):
        timed_out.check_cancel()


def test_wait_cancelled_wakes_when_cancelled_from_another_thread():
    ctx = RequestContext(seed=0)
    threading.Timer(0.05, ctx.cancel).start()
    assert ctx.wait_cancelled(timeout=5) is True


def test_progress_warnings_timings_and_binding():
    seen = []
    ctx = RequestContext(seed=0, progress=lambda *a: seen.append(a))
    ctx.progress(1, 4, "decoding")
    ctx.warn("fell back to eager")
    with ctx.timed("decode"):
        pass
    with ctx.timed("decode"):
        pass
    assert seen == [(1, 4, "decoding")]
    assert ctx.warnings == ["fell back to eager"]
    assert ctx.timings["decode"] >= 0
    assert current_context() is None
    with ctx.bind():
        assert current_context() is ctx
        other = RequestContext(seed=1)
        with other.bind():
            assert current_context() is other
        assert current_context() is ctx
    assert current_context() is None
    RequestContext(seed=0).progress(1)  # nobody listening is fine


def test_on_cancel_runs_each_callback_once_on_the_cancelling_thread():
    ctx = RequestContext()
    seen = []
    ctx.on_cancel(lambda: seen.append(("a", threading.get_ident())))
    ctx.on_cancel(lambda: seen.append(("b", threading.get_ident())))
    canceller = threading.Thread(target=lambda: [ctx.cancel("timeout") for _ in range(3)])
    canceller.start()
    canceller.join()
    ctx.cancel()
    assert sorted(label for label, _ in seen) == ["a", "b"]
    assert {thread for _, thread in seen} == {canceller.ident}
    with pytest.raises(OperationTimeoutError):  # the first reason stays
        ctx.check_cancel()


def test_on_cancel_after_the_cancel_runs_at_once():
    ctx = RequestContext()
    ctx.cancel()
    seen = []
    ctx.on_cancel(lambda: seen.append(1)).remove()
    assert seen == [1]


def test_a_removed_callback_is_not_called():
    ctx = RequestContext()
    seen = []
    with ctx.on_cancel(lambda: seen.append("scoped")):
        pass
    registration = ctx.on_cancel(lambda: seen.append("removed"))
    registration.remove()
    registration.remove()
    ctx.cancel()
    assert seen == []


def test_a_failing_callback_is_logged_and_the_others_still_run(caplog):
    ctx = RequestContext()
    seen = []

    def broken():
        raise RuntimeError("callback broke")

    ctx.on_cancel(broken)
    ctx.on_cancel(lambda: seen.append("after"))
    with caplog.at_level("ERROR", logger="mizuoto_runtime.context"):
        ctx.cancel()
    assert seen == ["after"]
    assert [record.exc_info[1].args for record in caplog.records] == [("callback broke",)]
    with caplog.at_level("ERROR", logger="mizuoto_runtime.context"):
        ctx.on_cancel(broken)  # already cancelled: run at once, still not raised
    assert len(caplog.records) == 2


def _race_cancels_and_registrations() -> list[int]:
    ctx = RequestContext()
    calls = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def record(n):
        with lock:
            calls.append(n)

    def register(base):
        start.wait()
        for n in range(base, base + 50):
            ctx.on_cancel(lambda n=n: record(n))

    def cancel():
        start.wait()
        ctx.cancel()

    threads = [threading.Thread(target=register, args=(i * 50,)) for i in range(4)]
    threads += [threading.Thread(target=cancel) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(calls)


def test_racing_cancels_and_registrations_call_every_callback_exactly_once():
    for _ in range(20):
        assert _race_cancels_and_registrations() == list(range(200))


def test_on_cancel_refuses_what_it_cannot_call():
    with pytest.raises(TypeError, match="on_cancel: expected a callable, got int"):
        RequestContext().on_cancel(3)
