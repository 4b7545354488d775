"""Sentences from text that is still arriving: the host's streamed text input (``text_input``).

A caller that streams text in (a language model writing a reply, a WebSocket client, a Wyoming
``synthesize-chunk``) puts pieces on ``EngineRequest.text_input``, a queue that ``None`` ends.
``sentences`` reads that queue for an engine and yields each sentence once it is finished, so the
engine speaks the first while the rest is still being written.

A sentence is finished when ``split_sentences`` would end it whatever text came next: every
piece of the text so far but the last one. ``split_sentences`` decides a boundary from the text
before it and the first character after the whitespace that follows it, so those pieces never
change as text is added; the last piece waits for more text or for the end. The sentences of a
text fed in any pieces are therefore exactly ``split_sentences`` of the joined text.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import TYPE_CHECKING

from mizuoto_runtime.text.sentences import split_sentences
from mizuoto_sdk.errors import InvalidRequest

if TYPE_CHECKING:
    from mizuoto_runtime.context import RequestContext

__all__ = ["POLL_SECONDS", "sentences"]

POLL_SECONDS = 0.02
"""How long one wait on the queue lasts before the call's cancel and timeout are checked."""


def sentences(
    text: str,
    ctx: RequestContext,
    *,
    max_length: int | None = None,
    max_characters: int | None = None,
) -> Iterator[str]:
    """``text`` and then the pieces of ``ctx.text_input``, cut into sentences as they finish.

    Without a text input this is ``split_sentences(text, max_length)``; with one, ``text`` is
    the start of the text (often empty) and the queue's pieces follow it until ``None``. The
    wait for a piece checks ``ctx.check_cancel()`` every ``POLL_SECONDS``, so a caller that
    abandons the feed ends the call by cancelling it, and the call's timeout still holds.
    ``max_characters`` bounds the whole text: more is an InvalidRequest naming ``text``, raised
    when the text grows past it. ``max_length`` cuts a long sentence softly, as
    ``split_sentences`` does, once the sentence is finished.
    """
    _check_size(len(text), max_characters)
    feed = ctx.text_input
    if feed is None:
        yield from split_sentences(text, max_length)
        return
    pending = text
    received = len(text)
    while True:
        *finished, pending = split_sentences(pending) or [""]
        for sentence in finished:
            yield from _cut(sentence, max_length)
        piece = _next_piece(feed, ctx)
        if piece is None:
            break
        if not isinstance(piece, str):
            raise InvalidRequest(
                f"text_input: expected pieces of text (str) and None at the end, got "
                f"{type(piece).__name__}",
                {"field": "text_input"},
            )
        received += len(piece)
        _check_size(received, max_characters)
        pending += piece
    yield from split_sentences(pending, max_length)


def _next_piece(feed: queue.Queue[str | None], ctx: RequestContext) -> str | None:
    while True:
        ctx.check_cancel()
        try:
            return feed.get(timeout=POLL_SECONDS)
        except queue.Empty:
            continue


def _cut(sentence: str, max_length: int | None) -> list[str]:
    return [sentence] if max_length is None else split_sentences(sentence, max_length)


def _check_size(received: int, max_characters: int | None) -> None:
    if max_characters is not None and received > max_characters:
        raise InvalidRequest(
            f"text: {received} characters is more than this engine's {max_characters}; "
            "split it and synthesize each part",
            {"field": "text", "limit": max_characters},
        )
