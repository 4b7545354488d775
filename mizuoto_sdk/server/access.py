"""Who may ask the server: a token on every request when it has one, and, bound to loopback,
only requests addressed to a loopback name.

The Host check stops DNS rebinding: a web page elsewhere whose name is made to resolve to
127.0.0.1 would otherwise reach a loopback server from the user's browser. The token comes as
``Authorization: Bearer <token>`` or as the cookie ``GET /?token=<token>`` sets for the page.
"""

from __future__ import annotations

import hmac
import json
from http.cookies import SimpleCookie
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

COOKIE = "mizuoto_token"
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


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
            await self.app(scope, receive, send)
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
