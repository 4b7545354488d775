"""What one request may make the server hold: a JSON body of ``MAX_JSON_BODY`` bytes at most, and a
connection for ``REQUEST_TIMEOUT`` seconds at most while the request's head, or a JSON body, is
still on its way.

``BodyLimit`` (ASGI middleware) reads a body as it comes and answers 413 as soon as it passes the
limit (at once when its declared length does), never holding more than the limit; a body that
has not arrived whole within ``REQUEST_TIMEOUT`` is answered 408. ``HeadDeadline`` is uvicorn's
h11 protocol with a deadline for the head: uvicorn itself bounds only the wait between two
requests (``timeout_keep_alive``) and a head's size (``h11_max_incomplete_event_size``), not how
long a head may take, so a client that opens connections and sends half a request could hold
each of them for ever. A connection whose head is not whole ``REQUEST_TIMEOUT`` seconds after
the connection opened, or after the head's first byte on a kept-alive connection, is answered
408 and closed.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_JSON_BODY = 2**20
"""The largest request body of a JSON route (a synthesis's text and params need far less)."""
REQUEST_TIMEOUT = 10.0
"""Seconds a request's head, and a JSON body, may take to arrive whole."""


def error_body(code: str, message: str, detail: dict[str, object]) -> bytes:
    return json.dumps({"code": code, "message": message, "detail": detail}).encode()


class BodyLimit:
    """Reads each request's body, up to ``limit`` bytes, before the app sees the request; the
    paths in ``own_limits`` read their bodies themselves (a voice recording)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int = MAX_JSON_BODY,
        timeout: float = REQUEST_TIMEOUT,
        own_limits: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout
        self.own_limits = own_limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.own_limits:
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._too_large(send)
            return
        try:
            first = await asyncio.wait_for(self._body(receive), self.timeout)
        except asyncio.TimeoutError:
            message = f"the request's body did not arrive whole within {self.timeout:g} s"
            detail: dict[str, object] = {"field": "body", "limit_seconds": self.timeout}
            await _answer(send, 408, error_body("request_timeout", message, detail))
            return
        if first is None:
            await self._too_large(send)
            return

        async def replayed() -> Message:
            nonlocal first
            if first is None:
                return await receive()  # the disconnect, for a stream that watches for it
            message, first = first, None
            return message

        await self.app(scope, replayed, send)

    async def _body(self, receive: Receive) -> Message | None:
        """The whole body as one message (or the disconnect that cut it); None past the limit."""
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return message
            body += message.get("body", b"")
            if len(body) > self.limit:
                return None
            if not message.get("more_body", False):
                return {"type": "http.request", "body": bytes(body), "more_body": False}

    async def _too_large(self, send: Send) -> None:
        message = (
            f"the request's body is larger than {self.limit} bytes, the most a JSON request "
            "may send"
        )
        detail: dict[str, object] = {"field": "body", "limit_bytes": self.limit}
        await _answer(send, 413, error_body("request_too_large", message, detail))


async def _answer(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class HeadDeadline(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request head is late (408)."""

    head_timeout = REQUEST_TIMEOUT

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the head is whole: the app has the request
            self._disarm()
        elif self._deadline is None:  # the first bytes of a kept-alive connection's next head
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(self.head_timeout, self._late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _late(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        message = f"the request's head did not arrive whole within {self.head_timeout:g} s"
        body = error_body("request_timeout", message, {"limit_seconds": self.head_timeout})
        head = (
            b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        )
        self.transport.write(head + body)
        self.transport.close()


def head_deadline(seconds: float) -> type[HeadDeadline]:
    """The protocol class with a head deadline of ``seconds``."""
    return type("HeadDeadline", (HeadDeadline,), {"head_timeout": seconds})
