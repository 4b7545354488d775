"""mizuoto_runtime.text.streamed.sentences: text streamed in, read sentence by sentence."""

from __future__ import annotations

import queue
import random
import threading
import time

import pytest

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.text import split_sentences
from mizuoto_runtime.text.streamed import sentences
from mizuoto_sdk import EngineManifest, ModelEntry
from mizuoto_sdk.errors import CancelledError, InvalidRequest, OperationTimeoutError

TEXTS = [
    "Dr. Smith arrived at 9 a.m. today. He paid $3.50! Then... 好的。走吧！",  # noqa: RUF001
    '"Hi." she said. Wait... what? No. 5 is next. J. R. R. Tolkien wrote it, etc. And so on',
    "A title\nA list item\n\nU.S. forces vs. the rest, e.g. here. Fin.   ",
    "one long clause, then another, and another; with no end at all " * 3,
]


def fed(pieces: list[str]) -> RequestContext:
    feed: queue.Queue[str | None] = queue.Queue()
    for piece in (*pieces, None):
        feed.put(piece)
    return RequestContext(seed=0, text_input=feed)


def cuts(text: str, rng: random.Random, count: int) -> list[str]:
    points = sorted(rng.sample(range(1, len(text)), min(count, len(text) - 1)))
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@pytest.mark.parametrize("max_length", [None, 24])
@pytest.mark.parametrize("text", TEXTS)
def test_any_cut_of_the_text_gives_the_joined_texts_sentences(text, max_length):
    want = split_sentences(text, max_length)
    rng = random.Random(text)
    for count in (1, 2, 5, len(text) - 1):  # down to one character a piece, mid-word
        for _ in range(5):
            first, *rest = cuts(text, rng, count)
            got = list(sentences(first, fed(rest), max_length=max_length))
            assert got == want, (first, rest)


def test_without_a_text_input_it_is_split_sentences():
    ctx = RequestContext(seed=0)
    assert list(sentences(TEXTS[0], ctx)) == split_sentences(TEXTS[0])


def test_the_start_texts_finished_sentences_come_before_any_piece():
    read = sentences("One. Two. Thr", RequestContext(seed=0, text_input=queue.Queue()))
    assert [next(read), next(read)] == ["One. ", "Two. "]  # nothing was fed yet


def test_a_finished_sentence_comes_before_the_end_of_the_text():
    feed: queue.Queue[str | None] = queue.Queue()
    read = sentences("First one. Sec", RequestContext(seed=0, text_input=feed))
    feed.put("ond")
    assert next(read) == "First one. "  # the queue has not ended
    feed.put("! Th")
    assert next(read) == "Second! "
    feed.put(None)
    assert list(read) == ["Th"]


def test_waiting_for_text_honours_cancel_and_timeout():
    for reason, error in (("cancelled", CancelledError), ("timeout", OperationTimeoutError)):
        ctx = RequestContext(seed=0, text_input=queue.Queue())
        read = sentences("Never ending", ctx)
        threading.Timer(0.05, ctx.cancel, (reason,)).start()
        started = time.perf_counter()
        with pytest.raises(error):
            next(read)
        assert time.perf_counter() - started < 1


def test_bad_pieces_and_long_texts_name_the_field():
    with pytest.raises(InvalidRequest) as caught:
        list(sentences("Hi. ", fed([b"bytes"])))  # type: ignore[list-item]
    assert caught.value.detail["field"] == "text_input"
    with pytest.raises(InvalidRequest) as caught:
        list(sentences("ab", fed(["cd. ", "ef"]), max_characters=5))
    assert caught.value.detail == {"field": "text", "limit": 5}
    with pytest.raises(InvalidRequest):
        list(sentences("abcdef", RequestContext(seed=0), max_characters=5))
    assert list(sentences("ab", fed(["cd. ", "e"]), max_characters=7)) == ["abcd. ", "e"]


def test_the_manifest_flag_defaults_off_and_must_be_a_bool():
    def manifest(**given: object) -> EngineManifest:
        return EngineManifest(
            id="x",
            implementation="x.y:Z",
            models=[ModelEntry("m")],
            capabilities=["synthesize"],
            **given,  # type: ignore[arg-type]
        )

    assert manifest().text_input is False
    assert manifest(text_input=True).text_input is True
    with pytest.raises(TypeError, match="text_input"):
        manifest(text_input="yes")
