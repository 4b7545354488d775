"""A synthesis streamed to an HTTP client: the engine runs on a thread of its own, the event loop
only forwards its chunks, and a client that goes away cancels the request.

``ChunkFeed`` runs the host's lazy stream on its thread and hands each chunk (or the error that
ended it) to the event loop as soon as it exists. ``WavStream`` sends them as one WAV: the header
and the first chunk together, then each chunk as it comes, while it listens for the client's
disconnect, which cancels the request (the engine stops at its next cancel check).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from starlette.responses import Response

from mizuoto_sdk.audio import pcm16, streamed_wav_header

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from mizuoto_sdk.request import EngineRequest
    from mizuoto_sdk.types import AudioChunk

log = logging.getLogger(__name__)

_END = object()


class StreamCut(Exception):
    """The synthesis failed after its first chunk was sent: the response ends without its last
    chunk, which is how an HTTP/1.1 client learns that the body is incomplete."""


class ChunkFeed:
    """The chunks of ``start()`` (called on the feed's thread), readable from the event loop."""

    def __init__(
        self, start: Callable[[], Iterable[AudioChunk]], request: EngineRequest, name: str
    ) -> None:
        self.request = request
        self.sent = 0
        self.first_chunk_seconds: float | None = None  # from the call to the engine's first chunk
        self._loop = asyncio.get_running_loop()
        self._items: asyncio.Queue[object] = asyncio.Queue()
        self._thread = threading.Thread(target=self._run, args=(start,), name=name, daemon=True)
        self._thread.start()

    def _run(self, start: Callable[[], Iterable[AudioChunk]]) -> None:
        began = time.perf_counter()
        try:
            for chunk in start():
                if self.first_chunk_seconds is None:
                    self.first_chunk_seconds = time.perf_counter() - began
                self._put(chunk)
                if self.request.cancel_event.is_set():
                    break  # the client left: closing the stream stops the engine now
        except BaseException as error:  # handed to the event loop, which raises it there
            self._put(error)
        finally:
            self._put(_END)

    def _put(self, item: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the event loop is gone (the server stopped): nobody to tell
            self.request.cancel()

    async def next(self) -> AudioChunk | None:
        """The next chunk, None at the end; the error that ended the stream is raised here."""
        item = await self._items.get()
        if item is _END:
            self._items.put_nowait(_END)  # a later call also sees the end
            return None
        if isinstance(item, BaseException):
            raise item
        self.sent += 1
        return item  # type: ignore[return-value]  # the queue holds chunks, errors and _END

    def cancel(self) -> None:
        self.request.cancel()


class WavStream(Response):
    """``audio/wav`` sent as the feed makes it, beginning with its first chunk."""

    media_type = "audio/wav"

    def __init__(
        self,
        feed: ChunkFeed,
        first: AudioChunk,
        headers: Mapping[str, str],
        ended: Callable[[str, int, BaseException | None], None],
    ) -> None:
        """``ended(state, chunks, error)`` is told how the stream ended: ``done``, ``cancelled``
        (the client left) or ``failed`` (with the error that cut it)."""
        self.status_code = 200
        self.background = None
        self.init_headers(dict(headers))  # no body: no content-length, the length is not known
        self.feed = feed
        self.first = first
        self.ended = ended

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        disconnected = asyncio.Event()
        watcher = asyncio.create_task(_watch_disconnect(receive, disconnected))
        sender = asyncio.create_task(self._send_all(send))
        try:
            await asyncio.wait({watcher, sender}, return_when=asyncio.FIRST_COMPLETED)
            if disconnected.is_set() and not sender.done():
                self.feed.cancel()
                sender.cancel()
                log.info("client went away after %d chunks: request cancelled", self.feed.sent)
                self.ended("cancelled", self.feed.sent, None)
            try:
                await asyncio.gather(sender, return_exceptions=disconnected.is_set())
            except StreamCut as cut:
                self.ended("failed", self.feed.sent, cut.__cause__)
                raise
        finally:
            self.feed.cancel()  # a no-op after a full stream; stops the engine otherwise
            watcher.cancel()

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        body = streamed_wav_header(self.first.sample_rate) + pcm16(self.first.samples)
        await send({"type": "http.response.body", "body": body, "more_body": True})
        while True:
            try:
                chunk = await self.feed.next()
            except Exception as error:
                code = getattr(error, "code", type(error).__name__)
                log.warning(
                    "synthesis failed after %d chunks [%s]: %s", self.feed.sent, code, error
                )
                raise StreamCut(f"[{code}] {error}") from error
            if chunk is None:
                break
            body = pcm16(chunk.samples)  # one rate: the host fails a stream whose rate changes
            await send({"type": "http.response.body", "body": body, "more_body": True})
        self.ended("done", self.feed.sent, None)  # before the client can see the end
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _watch_disconnect(receive: Receive, disconnected: asyncio.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    disconnected.set()


async def first_chunk(feed: ChunkFeed, receive: Receive) -> AudioChunk | None:
    """The feed's first chunk (None: it made none), or None after cancelling the request when the
    client goes away first; the error that ended the stream before any chunk is raised."""
    disconnected = asyncio.Event()
    watcher = asyncio.create_task(_watch_disconnect(receive, disconnected))
    reader = asyncio.create_task(feed.next())
    try:
        await asyncio.wait({watcher, reader}, return_when=asyncio.FIRST_COMPLETED)
        if not reader.done():
            feed.cancel()
            reader.cancel()
            return None
        return reader.result()
    finally:
        watcher.cancel()
