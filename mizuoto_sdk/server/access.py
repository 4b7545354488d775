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
``Origin`` header, when there is one, must name this server itself.
"""

from __future__ import annotations

import hmac
import json
from http.cookies import SimpleCookie
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

COOKIE = "mizuoto_token"
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
FORM_TYPES = frozenset(
    {"application/x-www-form-urlencoded", "multipart/form-data", "text/plain", ""}
)
"""Body types a page elsewhere can send without the server's leave ("": no type at all)."""


class Access:
    """ASGI middleware: refuses a request before it reaches the app, as a JSON error."""

    def __init__(self, app: ASGIApp, *, token: str | None, loopback: bool) -> None:
        self.app = app
        self.token = token
        self.loopback = loopback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
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
    if origin is not None:
        parts = urlsplit(origin)
        own = parts.scheme in ("http", "https") and parts.netloc.lower() == (
            headers.get("host", "").lower()
        )
        if not own:
            return (
                403,
                "forbidden",
                f"origin: this server acts only on requests from its own page, not from {origin!r}",
                {"field": "origin", "origin": origin},
            )
    given = headers.get("content-type", "")
    if given.partition(";")[0].strip().lower() in FORM_TYPES:
        return (
            415,
            "unsupported_media_type",
            f"content-type: {given or 'none'} is what a form on any web page can send; a "
            "request that changes something must say application/json (the voices upload: "
            "audio/wav)",
            {"field": "content-type", "content_type": given},
        )
    return None


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
