"""determinism.concurrent: calls at once on one loaded model, resident and with layers streamed.

The calls differ in everything a request carries (text, seed, a declared param), as two users'
requests do: an engine that keeps one request's input where another's can reach it gives one of
them the other's audio.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping

import attrs

from mizuoto_contract.outcome import Fail, Skip
from mizuoto_contract.subject import SEED, Subject, differ, join
from mizuoto_sdk import AudioChunk, EngineError, Param
from mizuoto_sdk.host import EngineRequest, LocalModel

_JOIN_SECONDS = 600.0


OTHER_TEXT = "Another caller, with 42 numbers."
"""What the second of two calls at once speaks: calls that share nothing but the model must not
share their input either, or an engine that mixes up requests passes."""


@attrs.frozen
class Call:
    """One of the calls made at once: its own text, seed and params."""

    text: str
    params: Mapping[str, object]

    def stream(self, subject: Subject, handle: LocalModel) -> Iterator[AudioChunk]:
        method = getattr(handle, subject.capability or "synthesize")
        return iter(method(*subject.arguments(self.text), EngineRequest(params=dict(self.params))))

    def audio(self, subject: Subject, handle: LocalModel) -> bytes:
        return join(list(self.stream(subject, handle)))

    def describe(self) -> str:
        return f"text {self.text[:24]!r}..., params {dict(self.params)}"


def _another_value(param: Param) -> object | None:
    """A valid value of ``param`` other than its default, near it; None where none is safe to
    pick without knowing the engine (a path, a free string, an unbounded default of None)."""
    if param.choices is not None:
        return next((c for c in param.choices if c != param.default), None)
    if param.type == "bool":
        return not param.default
    if param.type not in ("int", "float") or not isinstance(param.default, int | float):
        return None
    step = 1 if param.type == "int" else max(abs(param.default) * 0.05, 0.01)
    for value in (param.default + step, param.default - step):
        try:
            param.check(value)
        except (EngineError, ValueError, TypeError):
            continue
        return value
    return None


def calls(subject: Subject) -> tuple[Call, Call]:
    """The two calls made at once: the sample text's first sentence and the suite's seed; another
    text, another seed, and another value of the first declared param that has a safe one."""
    others: dict[str, object] = {}
    for param in subject.manifest.params:
        value = None if param.name == "seed" else _another_value(param)
        if value is not None:
            others[param.name] = value
            break
    return (
        Call(subject.sentence, {"seed": SEED}),
        Call(OTHER_TEXT, {"seed": SEED + 1, **others}),
    )


def _together(subject: Subject, handle: LocalModel, pair: tuple[Call, ...]) -> list[bytes]:
    """One stream per call, each on its own thread, pulled in lock step so that they overlap.

    An engine that declares ``max_concurrency`` below the number of streams has the host queue
    them, a stream keeping its turn until it ends: lock step would wait for a stream that cannot
    begin, so its streams are only started together, and the host's queue is what is checked.
    """
    limit = subject.manifest.max_concurrency
    barrier = threading.Barrier(len(pair) if limit is None or limit >= len(pair) else 1)
    results: list[bytes | None] = [None] * len(pair)
    errors: list[BaseException | None] = [None] * len(pair)

    def work(index: int) -> None:
        chunks = []
        try:
            for chunk in pair[index].stream(subject, handle):
                chunks.append(chunk)
                with contextlib.suppress(threading.BrokenBarrierError):
                    barrier.wait(timeout=_JOIN_SECONDS)
            results[index] = join(chunks)
        except BaseException as error:
            errors[index] = error
        finally:
            barrier.abort()  # the other stream runs on alone

    threads = [
        threading.Thread(target=work, args=(i,), name=f"mizuoto-contract-call-{i}", daemon=True)
        for i in range(len(pair))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=_JOIN_SECONDS)
    for error in errors:
        if error is not None:
            raise Fail(
                "both calls to succeed when made at once",
                f"{type(error).__name__}: {error}",
                subject.where(error),
            )
    if any(r is None for r in results):
        raise Fail("both calls to end", f"still running after {_JOIN_SECONDS:.0f} s")
    return [r for r in results if r is not None]


def _compare(
    subject: Subject, handle: LocalModel, how: str, serial: list[bytes] | None = None
) -> list[bytes]:
    """The two calls at once against the same calls one after the other (``serial``: their
    audio from a model that must give the same, made only where the calls at once differ from
    it); then the first call once more on its own. The serial audio, for the next model."""
    pair = calls(subject)
    if not subject.manifest.deterministic:  # no audio to compare: both calls must still work
        for call, audio in zip(pair, _together(subject, handle, pair), strict=True):
            if not audio:
                raise Fail(f"audio from the call with {call.describe()} made at once", "none")
        return []
    if serial is None:
        serial = [call.audio(subject, handle) for call in pair]
    together = _together(subject, handle, pair)
    if together != serial:  # perhaps this model's own serial audio differs: make it
        serial = [call.audio(subject, handle) for call in pair]
    for call, alone, mixed in zip(pair, serial, together, strict=True):
        if alone != mixed:
            raise Fail(
                f"the serial audio of the call with {call.describe()} from two calls at once "
                f"({how})",
                differ(alone, mixed),
            )
    again = pair[0].audio(subject, handle)
    if again != serial[0]:
        raise Fail(
            f"the first audio from a serial call after the concurrent ones ({how})",
            differ(serial[0], again),
        )
    return serial


def _streaming_budget_mb(handle: LocalModel) -> float | None:
    """A simulated device size that holds half the model (at least two of its largest parts),
    so that the rest streams layer by layer; None when no such size is smaller than the model."""
    if not handle.model_handles or handle.spec.device != "cpu":
        return None
    total = sum(h.size_bytes for h in handle.model_handles)
    largest = max(p.nbytes for h in handle.model_handles for p in h.parts)
    budget = max(total // 2, 2 * largest)
    return budget / 2**20 if budget < total else None


def concurrent(subject: Subject) -> None:
    handle = subject.load()
    serial = _compare(subject, handle, "fully resident")
    budget = _streaming_budget_mb(handle)
    handle.engine.unload()
    if budget is None:
        return
    service = subject.service({"compute.simulate_vram_mb": budget})
    streamed = subject.load(service)
    try:
        # Streaming layers changes no bit: the resident model's serial audio is the reference.
        how = f"layers streamed under a {budget:.2f} MiB budget"
        _compare(subject, streamed, how, serial or None)
        rows = service.runtime.manager.residency()
        if not any(row["streamed_bytes"] or row["host_bytes"] for row in rows):
            raise Skip(
                f"not run with streaming: the runtime kept the whole model resident under a "
                f"{budget:.2f} MiB budget"
            )
    finally:
        service.unload()
