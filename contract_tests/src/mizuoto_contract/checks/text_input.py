"""Checks on text streamed in (``EngineRequest.text_input``), for engines that declare
``text_input=True``: pieces cut anywhere give the whole text's audio, a finished sentence is
spoken before the text ends, and a feed that is abandoned ends with its cancel."""

from __future__ import annotations

import contextlib
import queue
import random
import threading
import time

from mizuoto_contract.checks.state import STREAM_OUTPUT
from mizuoto_contract.inputs import MEDIUM_TEXT
from mizuoto_contract.interrupt import STOP_BOUND_SECONDS
from mizuoto_contract.outcome import Fail
from mizuoto_contract.registry import Check
from mizuoto_contract.subject import SEED, Subject, differ, join
from mizuoto_runtime.text import split_sentences
from mizuoto_sdk import AudioChunk, EngineError
from mizuoto_sdk.host import EngineRequest

SENTENCE_BOUND_SECONDS = 120.0
"""How long the first sentence's chunk may take once its sentence has come."""
STARVED_BOUND_SECONDS = 1.0
"""How long an engine may wait on the open text input before speaking a finished sentence."""
LEFT_BOUND_SECONDS = 30.0
"""How long a check waits, after a failure, for the engine's call to end before it reports."""


def _pieces(text: str, cut: random.Random, size: int) -> list[str]:
    """``text`` cut at random points about ``size`` characters apart, mid-word as often as not."""
    points = sorted({cut.randrange(1, len(text)) for _ in range(max(1, len(text) // size))})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


class _Feed(queue.Queue[str | None]):
    """A text input that notes when the engine first waits on it empty: once it has every piece
    given so far (``starved``, a ``perf_counter`` time, None while it has not)."""

    def __init__(self) -> None:
        super().__init__()
        self.starved: float | None = None

    def get(self, block: bool = True, timeout: float | None = None) -> str | None:
        if self.starved is None and self.empty():
            self.starved = time.perf_counter()
        return super().get(block, timeout)


def _feed(pieces: list[str], end: bool = True) -> _Feed:
    feed = _Feed()
    for piece in (*pieces, *([None] if end else [])):
        feed.put(piece)
    return feed


def _sentences(subject: Subject) -> list[str]:
    """The sample text's sentences, or two of the suite's own when it has one."""
    found = split_sentences(subject.text)
    return found if len(found) > 1 else split_sentences(MEDIUM_TEXT)


def same_audio(subject: Subject) -> None:
    handle = subject.load()
    text = subject.text
    whole = subject.audio(handle, SEED, text)
    cut = random.Random(text)
    for size in (2, 7, 23):  # many one- and two-character pieces, words, parts of sentences
        first, *rest = _pieces(text, cut, size)
        request = EngineRequest(params={"seed": SEED}, text_input=_feed(rest))
        streamed = join(list(subject.stream(handle, request, first)))
        if streamed != whole:
            shown = f"{[first, *rest][:6]}{' ...' if len(rest) > 5 else ''}"
            raise Fail(
                "the same audio as the whole text for the same seed, for text fed in pieces",
                f"{differ(whole, streamed)}, for the pieces {shown}",
            )


def spoken_before_the_end(subject: Subject) -> None:
    handle = subject.load()
    first, second, *_ = _sentences(subject)
    # The first sentence is finished, by the first character of the next: the text goes on.
    feed = _feed([first[1:], second[:1]], end=False)
    request = EngineRequest(params={"seed": SEED}, text_input=feed)
    stream = subject.stream(handle, request, first[:1])
    got: list[AudioChunk | BaseException] = []

    def pull() -> None:
        try:
            got.append(next(stream))
        except BaseException as error:
            got.append(error)

    worker = threading.Thread(target=pull, name="mizuoto-contract-text-input", daemon=True)
    worker.start()
    waited = _wait_for_chunk(worker, feed)
    try:
        if waited is not None:
            raise Fail(
                "a chunk once the first sentence had come, before the text's end",
                waited,
            )
        if isinstance(got[0], BaseException):
            raise got[0]
    finally:
        request.cancel()
        worker.join(LEFT_BOUND_SECONDS)
        if not worker.is_alive():  # the cancel may reach a stream not ended: its close says so
            with contextlib.suppress(EngineError):
                stream.close()


def _wait_for_chunk(worker: threading.Thread, feed: _Feed) -> str | None:
    """None once ``worker`` has its chunk (or error); else what the engine did instead: waited
    on the open text input for ``STARVED_BOUND_SECONDS`` with a finished sentence unspoken, or
    made no chunk within ``SENTENCE_BOUND_SECONDS``."""
    started = time.perf_counter()
    while worker.is_alive():
        worker.join(0.02)
        now = time.perf_counter()
        starved = feed.starved
        if worker.is_alive() and starved is not None and now - starved > STARVED_BOUND_SECONDS:
            return (
                f"none; it waited {STARVED_BOUND_SECONDS} s for more text with a finished "
                "sentence unspoken (does it read the text input to its end first?)"
            )
        if worker.is_alive() and now - started > SENTENCE_BOUND_SECONDS:
            return f"none within {SENTENCE_BOUND_SECONDS} s while the text input stayed open"
    return None


def abandoned_feed(subject: Subject) -> None:
    handle = subject.load()
    words = _sentences(subject)[0].split()
    feed = _feed([], end=False)
    request = EngineRequest(params={"seed": SEED}, text_input=feed)
    stream = subject.stream(handle, request, words[0])  # no sentence ends: the engine waits
    ended: list[BaseException | None] = []

    def drain() -> None:
        try:
            for _ in stream:
                pass
            ended.append(None)
        except BaseException as error:
            ended.append(error)

    worker = threading.Thread(target=drain, name="mizuoto-contract-text-input", daemon=True)
    worker.start()
    time.sleep(0.2)
    request.cancel()
    worker.join(STOP_BOUND_SECONDS)
    if not ended:
        worker.join(LEFT_BOUND_SECONDS)  # report once the call has ended, if it ends
        raise Fail(
            f"the call ended within {STOP_BOUND_SECONDS} s of a cancel while it waited for text",
            "it still waits: read the text input with mizuoto_runtime.text.streamed.sentences, "
            "or check ctx.check_cancel() while waiting on the queue",
        )
    error = ended[0]
    if not (isinstance(error, EngineError) and error.code == "cancelled"):
        raise Fail(
            "CancelledError through the host when a waiting call is cancelled",
            "the stream ended" if error is None else f"{type(error).__name__}: {error}",
        )


CHECKS = (
    Check(
        "text_input.same_audio",
        "Text fed through the text input in pieces, cut anywhere (mid-word too), gives the "
        "same audio as the whole text for the same seed.",
        "A language model or a WebSocket client writes its text in arbitrary pieces; a listener "
        "must hear the same take as from the finished text, however it was cut.",
        "Read the text input with `mizuoto_runtime.text.streamed.sentences(text, ctx)`, which "
        "gives the joined text's sentences; or list this check in `expected_failures` with why.",
        "streaming",
        same_audio,
        ("streaming", "text_input", "deterministic"),
        requires=(*STREAM_OUTPUT, "determinism.same_handle"),
    ),
    Check(
        "text_input.before_the_end",
        "A sentence is spoken as soon as it is finished, while the text input is still open.",
        "Text streamed in exists so that audio starts before the text is written to the end.",
        "Speak each sentence as it finishes (`sentences(text, ctx)` yields it then) instead of "
        "reading the queue to its end first.",
        "streaming",
        spoken_before_the_end,
        ("streaming", "text_input"),
        requires=STREAM_OUTPUT,
    ),
    Check(
        "text_input.abandoned",
        "A call that waits for text which never comes ends with CancelledError when cancelled.",
        "A client that goes away without ending its text must not hold the model forever.",
        "Wait on the queue in short steps and call `ctx.check_cancel()` between them "
        "(`sentences(text, ctx)` does).",
        "streaming",
        abandoned_feed,
        ("streaming", "text_input"),
        requires=STREAM_OUTPUT,
    ),
)
