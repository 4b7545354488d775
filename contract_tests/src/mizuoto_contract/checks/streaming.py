"""Checks on streams: generators that start lazily, yield good chunks, stop when told."""

from __future__ import annotations

import inspect
import time

from mizuoto_contract.registry import Check, Fail, Skip
from mizuoto_contract.subject import SEED, Subject
from mizuoto_runtime.context import RequestContext
from mizuoto_sdk import AudioChunk, CancelledError, EngineError, OperationTimeoutError

STOP_BOUND_SECONDS = 2.0
LAZY_BOUND_SECONDS = 0.05


def _first(subject: Subject, ctx: RequestContext, iterator: object) -> object:
    with subject.direct(ctx):
        return next(iterator)  # type: ignore[call-overload]


def returns_generator(subject: Subject) -> None:
    handle = subject.load()
    returned = subject.engine_stream(handle, RequestContext(seed=SEED))
    if not inspect.isgenerator(returned):
        raise Fail("a generator (write the method with `yield`)", type(returned).__name__)
    returned.close()


def lazy(subject: Subject) -> None:
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    handle = subject.load()
    started = time.perf_counter()
    with Count():
        returned = subject.engine_stream(handle, RequestContext(seed=SEED))
    elapsed = time.perf_counter() - started
    if hasattr(returned, "close"):
        returned.close()
    if Count.calls or elapsed > LAZY_BOUND_SECONDS:
        raise Fail(
            "no work before the first next()",
            f"{Count.calls} torch calls and {elapsed * 1000:.0f} ms before it",
        )


def chunks_valid(subject: Subject) -> None:
    import numpy as np

    handle = subject.load()
    ctx = RequestContext(seed=SEED)
    iterator = iter(subject.engine_stream(handle, ctx))  # type: ignore[call-overload]
    rates = set()
    count = 0
    while True:
        with subject.direct(ctx):
            chunk = next(iterator, None)
        if chunk is None:
            break
        count += 1
        if not isinstance(chunk, AudioChunk):
            raise Fail("every chunk a mizuoto_sdk.AudioChunk", type(chunk).__name__)
        samples = chunk.samples
        samples = samples.detach().float().cpu().numpy() if hasattr(samples, "detach") else samples
        if samples.shape[-1] == 0:
            raise Fail("non-empty chunks", f"chunk {count - 1} has no samples")
        if not np.isfinite(samples).all():
            raise Fail("finite samples", f"chunk {count - 1} holds NaN or inf")
        rates.add(chunk.sample_rate)
    if count == 0:
        raise Fail("at least one chunk", "an empty stream")
    if len(rates) > 1:
        raise Fail("one sample rate per stream", f"rates {sorted(rates)}")


def early_close(subject: Subject) -> None:
    handle = subject.load()
    ctx = RequestContext(seed=SEED)
    iterator = subject.engine_stream(handle, ctx)
    _first(subject, ctx, iterator)
    close = getattr(iterator, "close", None)
    if close is None:
        raise Fail("a closable stream", f"a {type(iterator).__name__} without close()")
    try:
        with subject.direct(ctx):
            close()
    except Exception as error:
        raise Fail(
            "close() to stop the stream quietly", f"{type(error).__name__}: {error}"
        ) from None
    if inspect.isgenerator(iterator) and inspect.getgeneratorstate(iterator) != "GEN_CLOSED":
        raise Fail("the generator closed", inspect.getgeneratorstate(iterator))
    closed = subject.close_early(handle)
    if closed is not None:
        raise Fail("the host's close() to stop the stream quietly", f"[{closed.code}] {closed}")
    if handle.engine.state != "ready":
        raise Fail("the model ready again after an early close", handle.engine.state)


def _stops(subject: Subject, reason: str, error_type: type[EngineError]) -> None:
    handle = subject.load()
    ctx = RequestContext(seed=SEED)
    iterator = subject.engine_stream(handle, ctx)
    _first(subject, ctx, iterator)
    ctx.cancel(reason)
    started = time.perf_counter()
    try:
        _first(subject, ctx, iterator)
    except StopIteration:
        raise Skip("the stream had one chunk: nothing left to stop") from None
    except error_type:
        elapsed = time.perf_counter() - started
        if elapsed > STOP_BOUND_SECONDS:
            raise Fail(f"a stop within {STOP_BOUND_SECONDS} s", f"{elapsed:.2f} s") from None
        return
    except Exception as error:
        raise Fail(
            f"{error_type.__name__} from ctx.check_cancel()", f"{type(error).__name__}: {error}"
        ) from None
    finally:
        iterator.close()  # type: ignore[attr-defined]
    raise Fail(f"{error_type.__name__} at the next step after ctx.cancel()", "another chunk")


def cancel(subject: Subject) -> None:
    _stops(subject, "cancelled", CancelledError)
    if not subject.cancel_midway(subject.load()):
        raise Fail("CancelledError through the host after cancel", "the stream ran to its end")


def timeout(subject: Subject) -> None:
    _stops(subject, "timeout", OperationTimeoutError)


def reuse_after_abort(subject: Subject) -> None:
    handle = subject.load()
    first = subject.audio(handle, SEED)
    if subject.audio(handle, SEED) != first:
        raise Skip("not run: repeated calls already differ (see determinism.same_handle)")
    subject.close_early(handle)
    subject.cancel_midway(handle)
    if subject.audio(handle, SEED) != first:
        raise Fail(
            "the first run's audio again after an early close and a cancel", "different audio"
        )


CHECKS = (
    Check(
        "stream.generator",
        "The streaming capability returns a generator of chunks.",
        "The host streams chunk by chunk and closes the generator when the caller stops.",
        "Write synthesize/convert/edit with `yield AudioChunk(...)`; never return a list.",
        "streaming",
        returns_generator,
        ("streaming",),
    ),
    Check(
        "stream.lazy",
        "No engine work happens before the first next().",
        "The host creates streams before it knows they will be consumed; work done early "
        "cannot be cancelled or timed.",
        "Put all computation inside the generator body, after its first line.",
        "streaming",
        lazy,
        ("streaming",),
    ),
    Check(
        "stream.chunks_valid",
        "Every chunk is a non-empty AudioChunk of finite samples at one sample rate.",
        "Players and encoders downstream need a fixed rate and real numbers.",
        "Yield AudioChunk(samples, rate); clamp or fix NaNs at the source.",
        "streaming",
        chunks_valid,
        ("streaming",),
    ),
    Check(
        "stream.early_close",
        "Closing the stream after one chunk runs the engine's cleanup and frees the model.",
        "Clients disconnect mid-stream; the model must be ready for the next request.",
        "Use try/finally in the generator; never swallow GeneratorExit or yield after it.",
        "streaming",
        early_close,
        ("streaming",),
    ),
    Check(
        "stream.cancel",
        "After a cancel the engine stops at its next step with CancelledError.",
        "Users cancel long takes; an engine that never checks keeps the device busy.",
        "Call ctx.check_cancel() between steps and let its CancelledError propagate.",
        "streaming",
        cancel,
        ("streaming",),
    ),
    Check(
        "stream.timeout",
        "After a timeout the engine stops with OperationTimeoutError.",
        "The server enforces time limits through the same context.",
        "Let the errors of ctx.check_cancel() propagate; do not catch and replace them.",
        "streaming",
        timeout,
        ("streaming",),
    ),
    Check(
        "stream.reuse_after_abort",
        "After an early close and a cancel, the same seeded request reproduces the first run.",
        "An aborted stream must not leave state (caches, positions) behind for the next.",
        "Reset per-request state when a call starts, not when it ends.",
        "streaming",
        reuse_after_abort,
        ("streaming",),
    ),
)
