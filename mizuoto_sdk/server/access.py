"""Who may ask the server: a token on every request when it has one, and, bound to loopback,
only requests addressed to a loopback name; a request that changes something must come from the
server's own page or from a program, never from a page elsewhere.

The Host check stops DNS rebinding: a web page elsewhere whose name is made to resolve to
127.0.0.1 would otherwise reach a loopback server from the user's browser. The token comes as
``Authorization: Bearer <token>`` or as the cookie ``GET /?token=<token>`` sets for the page.

A page elsewhere can still make the user's browser send a request to the server without asking
it first (a form, ``fetch`` in ``no-cors`` mode, ``sendBeacon``), but only with a body typed
``application/x-www-form-urlencoded``, ``multipart/form-data`` or ``text/plain``, or untyped; any
other type makes the browser ask the server first (a CORS preflight), which this server never
allows. So every request that changes something (any method but GET, HEAD and OPTIONS) must
carry another type (the API's are ``application/json`` and ``audio/wav``), and a browser's
``Origin`` header, when there is one, must name this server itself. The convert and edit uploads
are ``multipart/form-data``, a form's type: they pass only with a header no form can set
(``Authorization``, or ``X-Mizuoto-Client`` as the page sends), which a browser also asks first.

A browser opens a WebSocket to any address without asking first, so a WebSocket handshake gets
the same Host and token rules and its ``Origin``, when there is one, must name this server; a
refused handshake is closed (1008) before it is accepted, which the ASGI server answers as a 403.
"""

from __future__ import annotations

import hmac
import json
import logging
from http.cookies import SimpleCookie
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)

COOKIE = "mizuoto_token"
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
FORM_TYPES = frozenset(
    {"application/x-www-form-urlencoded", "multipart/form-data", "text/plain", ""}
)
"""Body types a page elsewhere can send without the server's leave ("": no type at all)."""
CLIENT_HEADER = "x-mizuoto-client"
"""A header no form sets: with it (or ``Authorization``), a multipart upload is a program's."""
POLICY = 1008
"""The WebSocket close code of a connection this server refuses."""


class Access:
    """ASGI middleware: refuses a request before it reaches the app, as a JSON error (a
    WebSocket handshake: closed with ``POLICY`` before it is accepted)."""

    def __init__(self, app: ASGIApp, *, token: str | None, loopback: bool) -> None:
        self.app = app
        self.token = token
        self.loopback = loopback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._handshake(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        if self.loopback and _host_name(headers.get("host", "")) not in LOOPBACK_NAMES:
            await _refuse(
                send,
                400,
                "invalid_request",
                "host: this server listens on loopback and answers only requests addressed to "
                "127.0.0.1, localhost or [::1]",
                {"field": "host", "host": headers.get("host", "")},
            )
            return
        if self.token is None or self._carries_token(headers):
            refusal = _cross_site(scope["method"], headers)
            if refusal is None:
                await self.app(scope, receive, send)
            else:
                await _refuse(send, *refusal)
            return
        offered = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [""])
        if scope["path"] == "/" and self._matches(offered[0]):  # the page's link: set the cookie
            cookie = f"{COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"
            await send(
                {
                    "type": "http.response.start",
                    "status": 303,
                    "headers": [(b"location", b"/"), (b"set-cookie", cookie.encode("latin-1"))],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        await _refuse(
            send,
            401,
            "unauthorized",
            "this server needs its token: send 'Authorization: Bearer <token>' (the token is in "
            "its server.json), or open the page as /?token=<token>",
            {},
        )

    async def _handshake(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket connection: passed on, or refused before it is accepted."""
        headers = _headers(scope)
        refusal = None
        if self.loopback and _host_name(headers.get("host", "")) not in LOOPBACK_NAMES:
            refusal = f"host: {headers.get('host', '')!r} is not a loopback name"
        elif not _own_origin(headers):
            refusal = f"origin: {headers['origin']!r} is another site"
        elif self.token is not None and not self._carries_token(headers):
            refusal = "the token is missing: send 'Authorization: Bearer <token>'"
        if refusal is None:
            await self.app(scope, receive, send)
            return
        log.info("WebSocket %s refused: %s", scope.get("path", ""), refusal)
        message = await receive()  # websocket.connect: the handshake waits for the answer
        if message["type"] == "websocket.connect":
            await send({"type": "websocket.close", "code": POLICY, "reason": refusal[:120]})

    def _carries_token(self, headers: dict[str, str]) -> bool:
        scheme, _, offered = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self._matches(offered.strip()):
            return True
        cookies = SimpleCookie()
        try:
            cookies.load(headers.get("cookie", ""))
        except Exception:  # a malformed cookie header carries no token
            return False
        return COOKIE in cookies and self._matches(cookies[COOKIE].value)

    def _matches(self, offered: str) -> bool:
        assert self.token is not None
        return hmac.compare_digest(offered.encode(), self.token.encode())


def _cross_site(
    method: str, headers: dict[str, str]
) -> tuple[int, str, str, dict[str, object]] | None:
    """Why a request that changes something may have been sent by a page elsewhere (status,
    code, message, detail), or None when it cannot have been."""
    if method.upper() in SAFE_METHODS:
        return None
    origin = headers.get("origin")
    if origin is not None and not _own_origin(headers):
        return (
            403,
            "forbidden",
            f"origin: this server acts only on requests from its own page, not from {origin!r}",
            {"field": "origin", "origin": origin},
        )
    given = headers.get("content-type", "")
    kind = given.partition(";")[0].strip().lower()
    if kind == "multipart/form-data" and ("authorization" in headers or CLIENT_HEADER in headers):
        return None  # a header no form sets: a program's upload, or the page's
    if kind in FORM_TYPES:
        return (
            415,
            "unsupported_media_type",
            f"content-type: {given or 'none'} is what a form on any web page can send; a "
            "request that changes something must say application/json (the voices upload: "
            "audio/wav; the convert and edit uploads: multipart/form-data with an "
            "Authorization or X-Mizuoto-Client header)",
            {"field": "content-type", "content_type": given},
        )
    return None


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _own_origin(headers: dict[str, str]) -> bool:
    """Whether the ``Origin`` header is absent (not a browser) or names this server itself."""
    origin = headers.get("origin")
    if origin is None:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == (
        headers.get("host", "").lower()
    )


def _host_name(host: str) -> str:
    """``127.0.0.1:7370`` -> ``127.0.0.1``; ``[::1]:7370`` -> ``[::1]``."""
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


async def _refuse(
    send: Send, status: int, code: str, message: str, detail: dict[str, object]
) -> None:
    body = json.dumps({"code": code, "message": message, "detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
