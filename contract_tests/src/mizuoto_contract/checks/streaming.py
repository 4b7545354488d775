"""Checks on streams: generators that start lazily, yield good chunks, stop when told."""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
import time
from typing import Any

from mizuoto_contract.checks.state import STREAM_OUTPUT
from mizuoto_contract.inputs import (
    MEDIUM_TEXT,
    SHORT_TEXTS,
    Example,
    explore,
)
from mizuoto_contract.interrupt import STOP_BOUND_SECONDS, interrupt_engine, interrupt_host
from mizuoto_contract.outcome import Fail, Skip
from mizuoto_contract.registry import Check
from mizuoto_contract.subject import SEED, Subject, differ, join
from mizuoto_runtime.context import RequestContext
from mizuoto_sdk import (
    AudioChunk,
    CancelledError,
    EngineError,
    OperationTimeoutError,
)
from mizuoto_sdk.host import EngineRequest, LocalModel

LAZY_BOUND_SECONDS = 0.05


def _first(subject: Subject, ctx: RequestContext, iterator: object) -> object:
    with subject.direct(ctx):
        return next(iterator)  # type: ignore[call-overload]  # an iterator: the engine's stream


def returns_generator(subject: Subject) -> None:
    handle = subject.load()
    returned = subject.engine_stream(handle, subject.context(SEED))
    if not inspect.isgenerator(returned):
        raise Fail("a generator (write the method with `yield`)", type(returned).__name__)
    returned.close()


def _torch_counter() -> Any:
    """A mode counting torch calls; None where torch was never imported (only time counts)."""
    if "torch" not in sys.modules:
        return None
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.calls += 1
            return func(*args, **(kwargs or {}))

    return Count()


def lazy(subject: Subject) -> None:
    handle = subject.load()
    counter = _torch_counter()
    started = time.perf_counter()
    with counter if counter is not None else contextlib.nullcontext():
        returned = subject.engine_stream(handle, subject.context(SEED))
    elapsed = time.perf_counter() - started
    if hasattr(returned, "close"):
        returned.close()
    calls = counter.calls if counter is not None else 0
    if calls or elapsed > LAZY_BOUND_SECONDS:
        counted = f"{calls} torch calls and " if counter is not None else ""
        raise Fail("no work before the first next()", f"{counted}{elapsed * 1000:.0f} ms before it")


MORE_TEXTS = (MEDIUM_TEXT,)
"""What stream.chunks_valid speaks besides the sample text and the explored examples (which bring
digits, symbols and letters that are not Latin): a longer input, where chunking goes wrong. An
engine may refuse it with InvalidRequest."""


def chunks_valid(subject: Subject) -> None:
    inputs = [(subject.text, SEED, False)]
    if subject.capability in ("synthesize", "edit"):  # their output depends on the text
        inputs += [(text, SEED + 1 + i, True) for i, text in enumerate(MORE_TEXTS)]
    handle = subject.load()
    for text, seed, may_refuse in inputs:
        subject.engine_audio(handle, text, seed, may_refuse)
    # Then seeds explored on short texts (the engine's own stream, chunk by chunk), each
    # example's audio kept for determinism.same_handle to compare with.
    spoken: dict[Example, bytes | None] = {}

    def valid(example: Example) -> None:
        spoken[example] = subject.engine_audio(
            handle, example.text, example.seed, True, named=False
        )

    explore(valid, subject.cases())
    subject.shared[f"explored:{subject.capability}"] = spoken


LATE_CHUNKS = 3
"""How many chunks early_close takes before it closes a stream late."""


def early_close(subject: Subject) -> None:
    handle = subject.load()
    ctx = subject.context(SEED)
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
    # Late too, on the model already used: cleanup that only has work after several chunks.
    late = subject.stream(handle, EngineRequest(params={"seed": SEED + 2}))
    taken = sum(1 for _ in zip(range(LATE_CHUNKS), late, strict=False))
    try:
        late.close()
    except EngineError as error:
        raise Fail(
            f"the host's close() after {taken} chunks to stop the stream quietly",
            f"[{error.code}] {error}",
            subject.where(error),
        ) from None
    if handle.engine.state != "ready":
        raise Fail(f"the model ready again after a close after {taken} chunks", handle.engine.state)


def _stops(subject: Subject, reason: str, error_type: type[EngineError]) -> None:
    handle = subject.load()
    # On a model already used (a call ran to its end), as a server's models are: an engine
    # whose later calls take another path (a cache, a warmed-up fast path) must stop there too.
    subject.audio(handle, SEED, subject.sentence)
    seen = interrupt_engine(subject, handle, subject.context(SEED), reason)
    if seen.outcome in (reason, "finished"):
        return  # stopped in time, or ended in time with nothing left to stop
    where = subject.where(seen.error) if seen.error is not None else None
    raise Fail(
        f"{error_type.__name__} from the engine within {STOP_BOUND_SECONDS} s of "
        f"ctx.cancel({reason!r}), during a step or at the next one",
        seen.describe(),
        where,
    )


def cancel(subject: Subject) -> None:
    _stops(subject, "cancelled", CancelledError)
    seen = interrupt_host(subject, subject.load())
    if seen.outcome != "cancelled":
        raise Fail(
            f"CancelledError through the host within {STOP_BOUND_SECONDS} s of a cancel "
            "(a longer --text gives a short stream work to cancel)",
            seen.describe(),
            subject.where(seen.error) if seen.error is not None else None,
        )


def timeout(subject: Subject) -> None:
    _stops(subject, "timeout", OperationTimeoutError)


def reuse_after_abort(subject: Subject) -> None:
    handle = subject.load()
    text = subject.sentence  # the aborted streams speak what is replayed
    first = subject.audio(handle, SEED, text)
    if not subject.manifest.deterministic:  # its audio is not compared: calls must still work
        subject.close_early(handle, text)
        interrupt_host(subject, handle, text)
        if not subject.audio(handle, SEED, text):
            raise Fail("audio from a call after an early close and a cancel", "no samples")
        return
    if subject.audio(handle, SEED, text) != first:
        raise Skip("not run: repeated calls already differ (see determinism.same_handle)")
    subject.close_early(handle, text)
    # A short text may end before the cancel reaches it: the call was still made.
    if interrupt_host(subject, handle, text).outcome not in ("cancelled", "finished"):
        raise Skip("not run: the stream cannot be cancelled (see stream.cancel)")
    again = subject.audio(handle, SEED, text)
    if again != first:
        raise Fail(
            "the first run's audio again after an early close and a cancel", differ(first, again)
        )


def equivalence(subject: Subject) -> None:
    """Chunks pulled one at a time, each from a thread of its own (as a server's thread pool
    does), against the whole output computed in one step by the host's ``collect``."""
    handle = subject.load()
    for turn, text in enumerate((subject.sentence, SHORT_TEXTS[0])):
        _equivalent(subject, handle, text, SEED + turn)


def _equivalent(subject: Subject, handle: LocalModel, text: str, seed: int) -> None:
    stream = subject.stream(handle, EngineRequest(params={"seed": seed}), text)
    chunks: list[AudioChunk] = []
    while True:
        pulled: list[object] = []

        def pull(out: list[object] = pulled) -> None:
            try:
                out.append(next(stream))
            except StopIteration:
                out.append(None)
            except BaseException as error:
                out.append(error)

        # A thread per chunk, which ends with it: a thread that lived on would keep a team of
        # torch's OpenMP threads that slows every later call on a machine with few cores.
        worker = threading.Thread(target=pull, name="mizuoto-contract-pull", daemon=True)
        worker.start()
        worker.join()
        [item] = pulled
        if item is None:
            break
        if isinstance(item, BaseException):
            raise item
        chunks.append(item)  # type: ignore[arg-type]  # a chunk: None and errors are handled above
    streamed = join(chunks)
    whole = handle.collect(
        subject.capability or "synthesize",
        *subject.arguments(text),
        request=EngineRequest(params={"seed": seed}),
    )
    if whole.samples.tobytes() != streamed:
        raise Fail(
            "the concatenated stream equal to the same request's whole output (collect)",
            f"{differ(whole.samples.tobytes(), streamed)}, for {text!r}",
        )


# Run before the determinism checks: most later checks read whole streams through the host,
# and a bad chunk is reported once, here, instead of as a crash in each of them.
BASICS = (
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
        "Every chunk is a non-empty AudioChunk of finite samples at one sample rate, for many "
        "texts and seeds.",
        "Players and encoders downstream need a fixed rate and real numbers. Checked on the "
        "sample text, on two long sentences and on seeds explored with short texts by turns "
        "(--examples): words, digits and symbols, words not written in Latin letters (which an "
        "engine may refuse with InvalidRequest). Every chunk any other check receives is checked "
        "the same way.",
        "Yield AudioChunk(samples, rate); clamp or fix NaNs at the source.",
        "streaming",
        chunks_valid,
        ("streaming",),
    ),
)

CHECKS = (
    Check(
        "stream.equivalence",
        "The chunks of a stream, concatenated, equal the same request's whole output.",
        "Clients that stream and clients that wait for the file must hear the same take, "
        "whichever thread pulls each chunk.",
        "Keep per-request state in the generator's locals or the RequestContext, not in "
        "thread-locals or in what the consumer's pace decides.",
        "streaming",
        equivalence,
        ("streaming", "deterministic"),
        requires=(*STREAM_OUTPUT, "determinism.same_handle"),
    ),
    Check(
        "stream.early_close",
        "Closing the stream after one chunk, or after several, runs the engine's cleanup and "
        "frees the model.",
        "Clients disconnect mid-stream; the model must be ready for the next request.",
        "Use try/finally in the generator; never swallow GeneratorExit or yield after it.",
        "streaming",
        early_close,
        ("streaming",),
        requires=STREAM_OUTPUT,
    ),
    Check(
        "stream.cancel",
        f"A cancel, during a step or between chunks of a long text, on a model already used, "
        f"ends the stream with CancelledError within {STOP_BOUND_SECONDS:g} s.",
        "Users cancel long takes; an engine that never checks keeps the device busy.",
        "Call ctx.check_cancel() between steps and inside long ones (or wait with "
        "ctx.wait_cancelled()), and let its CancelledError propagate.",
        "streaming",
        cancel,
        ("streaming",),
        requires=STREAM_OUTPUT,
    ),
    Check(
        "stream.timeout",
        f"A timeout, during a step or between chunks of a long text, on a model already used, "
        f"ends the stream with OperationTimeoutError within {STOP_BOUND_SECONDS:g} s.",
        "The server enforces time limits through the same context.",
        "Let the errors of ctx.check_cancel() propagate; do not catch and replace them.",
        "streaming",
        timeout,
        ("streaming",),
        requires=STREAM_OUTPUT,
    ),
    Check(
        "stream.reuse_after_abort",
        "After an early close and a cancel, the same seeded request reproduces the first run.",
        "An aborted stream must not leave state (caches, positions) behind for the next.",
        "Reset per-request state when a call starts, not when it ends.",
        "streaming",
        reuse_after_abort,
        ("streaming",),
        requires=STREAM_OUTPUT,
    ),
)
