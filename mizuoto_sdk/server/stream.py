"""A synthesis streamed to an HTTP client: the engine runs on a thread of its own, at most ``AHEAD``
chunks ahead of the client, and a client that goes away cancels the request.

``ChunkFeed`` runs the host's lazy stream on its thread and hands each chunk (or the error that
ended it) to the event loop. The thread asks the engine for the next chunk only while fewer than
``AHEAD`` chunks wait to be sent, so a client that reads slowly, or not at all, holds the engine
back instead of filling the server's memory: with the socket's buffers full, the sender waits, the
feed waits, and so does the engine. ``WavStream`` sends the chunks as one WAV: the header and the
first chunk together, then each chunk as it comes, while it listens for the client's disconnect,
which cancels the request (the engine stops at its next cancel check). ``Feeds`` knows every feed
that runs, so that a stopping server can cancel them and wait for their engines to unwind.
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
from mizuoto_sdk.errors import EngineUnavailable

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from mizuoto_sdk.request import EngineRequest
    from mizuoto_sdk.types import AudioChunk

log = logging.getLogger(__name__)

AHEAD = 2
"""Chunks an engine may have computed that the client has not yet taken (the sender holds one
more while the socket takes it): enough to keep a steady client fed, and all a slow one costs."""

_END = object()


class StreamCut(Exception):
    """The synthesis failed after its first chunk was sent: the response ends without its last
    chunk, which is how an HTTP/1.1 client learns that the body is incomplete."""


class ChunkFeed:
    """The chunks of ``start()`` (called on the feed's thread), readable from the event loop."""

    def __init__(
        self,
        start: Callable[[], Iterable[AudioChunk]],
        request: EngineRequest,
        name: str,
        ahead: int = AHEAD,
    ) -> None:
        self.request = request
        self.sent = 0
        self.waiting = False  # the engine is held back: the client has not taken what it made
        self.first_chunk_seconds: float | None = None  # from the call to the engine's first chunk
        self._loop = asyncio.get_running_loop()
        self._items: asyncio.Queue[object] = asyncio.Queue()
        self._room = threading.Condition()
        self._free = ahead  # how many more chunks the engine may compute before one is taken
        self._thread = threading.Thread(target=self._run, args=(start,), name=name, daemon=True)

    def begin(self) -> None:
        self._thread.start()

    def _run(self, start: Callable[[], Iterable[AudioChunk]]) -> None:
        began = time.perf_counter()
        stream = None
        try:
            stream = iter(start())
            while self._take_room():
                chunk = next(stream, None)
                if chunk is None:
                    break
                if self.first_chunk_seconds is None:
                    self.first_chunk_seconds = time.perf_counter() - began
                self._put(chunk)
        except BaseException as error:  # handed to the event loop, which raises it there
            self._put(error)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:  # the client left or the server stops: the engine stops now
                try:
                    close()
                except Exception as error:
                    log.warning("%s: closing the stream failed: %s", self._thread.name, error)
            self._put(_END)

    def _take_room(self) -> bool:
        """Wait until the engine may compute one more chunk; False once the request is cancelled."""
        with self._room:
            while self._free == 0 and not self.request.cancel_event.is_set():
                self.waiting = True
                self._room.wait()
            self.waiting = False
            if self.request.cancel_event.is_set():
                return False
            self._free -= 1
            return True

    def _put(self, item: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the event loop is gone (the server stopped): nobody to tell
            self.cancel()

    async def next(self) -> AudioChunk | None:
        """The next chunk, None at the end; the error that ended the stream is raised here."""
        item = await self._items.get()
        if item is _END:
            self._items.put_nowait(_END)  # a later call also sees the end
            return None
        if isinstance(item, BaseException):
            raise item
        self.sent += 1
        with self._room:  # the chunk is the sender's now: the engine may compute one more
            self._free += 1
            self._room.notify()
        return item  # type: ignore[return-value]  # the queue holds chunks, errors and _END

    def cancel(self) -> None:
        self.request.cancel()
        with self._room:
            self._room.notify()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float) -> bool:
        """Whether the feed's thread (and so its engine stream) has ended within ``timeout``."""
        self._thread.join(max(0.0, timeout))
        return not self._thread.is_alive()


class Feeds:
    """The feeds that run now, by request id; once ``stop`` is called, no new one starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._feeds: dict[str, ChunkFeed] = {}
        self.stopping = False

    def start(
        self,
        key: str,
        start: Callable[[], Iterable[AudioChunk]],
        request: EngineRequest,
        name: str,
    ) -> ChunkFeed:
        """A running feed of ``start()`` under ``key``; ``engine_unavailable`` once the server
        stops."""
        feed = ChunkFeed(start, request, name)
        with self._lock:
            if self.stopping:
                raise EngineUnavailable(
                    "the server is stopping: it takes no new work", {"reason": "stopping"}
                )
            self._feeds = {k: f for k, f in self._feeds.items() if f.running}
            self._feeds[key] = feed
            feed.begin()  # here: a stop that lists the feed may join its thread
        return feed

    def get(self, key: str) -> ChunkFeed | None:
        """The feed under ``key`` while its thread runs."""
        with self._lock:
            feed = self._feeds.get(key)
        return feed if feed is not None and feed.running else None

    def stop(self) -> None:
        """Start no new feed, and cancel every running one: each closes its engine stream on its
        own thread, at once if it waits for its client, else at the engine's next cancel check."""
        with self._lock:
            self.stopping = True
            feeds = list(self._feeds.values())
        for feed in feeds:
            feed.cancel()

    def wait(self, deadline: float) -> int:
        """Wait until ``deadline`` (``time.monotonic()``) at most for every feed to end; how many
        had not ended by then."""
        with self._lock:
            feeds = list(self._feeds.values())
        return sum(not feed.join(deadline - time.monotonic()) for feed in feeds)


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
                cancelled = getattr(cut.__cause__, "code", None) == "cancelled"  # a stop
                self.ended("cancelled" if cancelled else "failed", self.feed.sent, cut.__cause__)
                raise
        finally:
            self.feed.cancel()  # a no-op after a full stream; stops the engine otherwise
            watcher.cancel()
            sender.cancel()  # this task was cancelled (a stop): the sender goes with it

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        body = streamed_wav_header(self.first.sample_rate) + pcm16(self.first.samples)
        await send({"type": "http.response.body", "body": body, "more_body": True})
        while True:
            try:
                chunk = await self.feed.next()
            except Exception as error:
                code = getattr(error, "code", type(error).__name__)
                if code == "cancelled":  # the server stops (a client that left is not sent to)
                    log.info("synthesis cancelled after %d chunks: %s", self.feed.sent, error)
                else:
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
