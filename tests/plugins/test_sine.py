"""The sine engine through the host: seeded, streamed per word, cancellable."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest

from mizuoto_sdk import CancelledError, EngineError
from mizuoto_sdk.host import EngineRequest, RuntimeService


@pytest.fixture
def sine():
    return RuntimeService().load("sine")


def audio(handle, text="hello big world", **params):
    chunks = list(handle.synthesize(text, EngineRequest(params=params)))
    return chunks, np.concatenate([c.samples for c in chunks])


def test_one_chunk_per_word(sine):
    chunks, _ = audio(sine, seed=1)
    assert [c.metadata["word"] for c in chunks] == ["hello", "big", "world"]
    assert {c.sample_rate for c in chunks} == {16000}
    assert all(np.isfinite(c.samples).all() and np.abs(c.samples).max() <= 0.3 for c in chunks)


def test_the_seed_decides_the_jitter(sine):
    _, first = audio(sine, seed=3)
    _, again = audio(RuntimeService().load("sine"), seed=3)
    _, other = audio(sine, seed=4)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)


def test_the_tone_follows_the_characters(sine):
    # Each character is one note: the dominant frequency of a note rises with its character code.
    _, samples = audio(sine, "ab", seed=0)
    note = len(samples) // 2 - 320
    spectrum = [np.abs(np.fft.rfft(samples[i * note : (i + 1) * note])).argmax() for i in range(2)]
    assert spectrum[1] > spectrum[0]


def test_speed_is_validated_and_shortens_the_audio(sine):
    _, normal = audio(sine, seed=0)
    _, fast = audio(sine, seed=0, speed=2.0)
    assert len(fast) < len(normal)
    with pytest.raises(EngineError) as caught:
        audio(sine, speed="fast")
    assert caught.value.code == "invalid_request" and caught.value.detail["field"] == "params.speed"


def test_cancel_stops_between_words(sine):
    request = EngineRequest(params={"seed": 0})
    stream = sine.synthesize("one two three", request)
    next(stream)
    request.cancel()
    time.sleep(0.06)  # the watcher forwards the cancel within 20 ms
    with pytest.raises(CancelledError):
        next(stream)
    assert len(list(sine.synthesize("again", EngineRequest(params={"seed": 0})))) == 1


def test_capabilities_it_lacks_are_unsupported(sine):
    with pytest.raises(EngineError) as caught:
        sine.call("anything")
    assert caught.value.code == "capability_not_supported"


@pytest.mark.parametrize("length", [1001, 100_000])
def test_text_longer_than_the_declared_limit_is_refused_before_any_work(sine, length):
    limit = sine.description["limits"]["text_characters"]
    assert limit == 1000
    with pytest.raises(EngineError) as caught:
        audio(sine, "ab " * (length // 3) + "x" * (length % 3))
    assert caught.value.code == "invalid_request"
    assert (caught.value.detail["field"], caught.value.detail["limit"]) == ("text", limit)
    chunks, _ = audio(sine, ("abc " * 250)[:limit], seed=0)
    assert len(chunks) == 250


def fed(*pieces):
    """A text input holding ``pieces`` and its end."""
    feed: queue.Queue[str | None] = queue.Queue()
    for piece in (*pieces, None):
        feed.put(piece)
    return feed


def test_text_streamed_in_pieces_gives_the_whole_texts_tones(sine):
    text = "Hello big world. Then one more! Last words"
    _, whole = audio(sine, text, seed=5)
    cut = [text[:3], text[3:17], text[17:30], text[30:]]  # mid-word and mid-sentence
    # The host wants some text to start with: the first piece, the rest streamed after it.
    request = EngineRequest(params={"seed": 5}, text_input=fed(*cut[1:]))
    chunks = list(sine.synthesize(cut[0], request))
    assert [c.metadata["word"] for c in chunks] == text.split()
    assert np.array_equal(np.concatenate([c.samples for c in chunks]), whole)


def test_streamed_text_is_spoken_before_it_ends_and_a_cancel_ends_the_wait(sine):
    feed: queue.Queue[str | None] = queue.Queue()
    request = EngineRequest(params={"seed": 0}, text_input=feed)
    stream = sine.synthesize("First", request)
    feed.put(" sentence. Sec")
    assert next(stream).metadata["word"] == "First"  # the rest of the text has not come
    assert next(stream).metadata["word"] == "sentence."
    threading.Timer(0.1, request.cancel).start()
    started = time.perf_counter()
    with pytest.raises(CancelledError):
        next(stream)
    assert time.perf_counter() - started < 2


def test_streamed_text_past_the_limit_is_refused(sine):
    with pytest.raises(EngineError) as caught:
        list(sine.synthesize("abc. ", EngineRequest(text_input=fed(*["abc. "] * 200))))
    assert (caught.value.code, caught.value.detail["field"]) == ("invalid_request", "text")
