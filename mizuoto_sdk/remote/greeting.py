"""The agent's side of a connection's start: the TLS handshake when the agent serves TLS, then
the ``hello`` with the token and the protocol, all of it within one deadline.

Nothing but the hello is read before it is accepted, and it is read with a small limit
(``HELLO_LIMIT``) and bounded parsing (``frames.MAX_DEPTH``): a host without the token can make
the agent hold a connection for ``hello_timeout`` seconds at most and read 64 KiB at most, however
slowly its bytes come. Each refusal is a ``refused`` frame with a reason the host turns into a fix
(``token``, ``protocol``, ``timeout``, ``hello``, ``frame``, and ``tls`` for a host that sent a
plain hello to a TLS agent).
"""

from __future__ import annotations

import contextlib
import hmac
import importlib.metadata
import socket
import ssl
import time
from collections.abc import Callable, Mapping

from mizuoto_sdk.frames import FrameError, encode
from mizuoto_sdk.remote.wire import PROTOCOL, ConnectionClosed, FrameSocket, PeerSpeaksTLS

__all__ = ["HELLO_LIMIT", "greet", "sdk_version"]

HELLO_LIMIT = 64 << 10
"""The largest first frame read from a connection that has not shown its token (64 KiB)."""


def sdk_version() -> str:
    try:
        return importlib.metadata.version("mizuoto-sdk")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def greet(
    connection: socket.socket,
    *,
    token: bytes,
    ssl_context: ssl.SSLContext | None,
    hello_timeout: float,
    ready: Callable[[], Mapping[str, object]],
) -> socket.socket | None:
    """The connection (wrapped in TLS with ``ssl_context``) once its hello is accepted and
    answered with ``ready()``; None once it was refused. A connection that fails raises
    ``OSError`` or ``ConnectionClosed``."""
    deadline = time.monotonic() + hello_timeout
    connection.settimeout(hello_timeout)
    try:
        if ssl_context is not None:
            if not _starts_tls(connection, deadline):
                return None
            # the handshake as a whole is bounded by the socket's timeout
            connection.settimeout(max(deadline - time.monotonic(), 0.001))
            connection = ssl_context.wrap_socket(connection, server_side=True)
        hello = FrameSocket(connection, HELLO_LIMIT).receive(deadline)
    except TimeoutError:
        _refuse(connection, "engine_unavailable", "no hello in time", {"reason": "timeout"})
        return None
    except PeerSpeaksTLS:
        return None  # a TLS host at a plain agent: it cannot read a refusal; its handshake fails
    except FrameError as error:
        _refuse(connection, "invalid_request", f"a malformed frame: {error}", {"reason": "frame"})
        return None
    sent = hello.header.get("token")
    if hello.kind != "hello" or not isinstance(sent, str):
        _refuse(
            connection, "engine_unavailable", "expected a hello with a token", {"reason": "hello"}
        )
        return None
    if not hmac.compare_digest(sent.encode(), token):
        _refuse(connection, "engine_unavailable", "wrong token", {"reason": "token"})
        return None
    protocol = hello.header.get("protocol")
    if protocol != PROTOCOL:
        _refuse(
            connection,
            "engine_unavailable",
            f"this agent speaks protocol {PROTOCOL} (mizuoto-sdk {sdk_version()}), the host "
            f"{protocol!r} (mizuoto-sdk {hello.header.get('version')}): install the same "
            "Mizuoto version on both machines",
            {"reason": "protocol", "protocol": PROTOCOL, "host_protocol": protocol},
        )
        return None
    connection.settimeout(None)
    connection.sendall(encode("ready", ready()))
    return connection


def _starts_tls(connection: socket.socket, deadline: float) -> bool:
    """Whether the host begins a TLS handshake, as this agent expects. A host without ``tls``
    sends its hello instead, which is read (a socket closed with bytes unread resets the
    connection, and the host would see only that) and refused in plain words it can read."""
    first = connection.recv(1, socket.MSG_PEEK)
    if not first or first == b"\x16":  # a handshake record; or the host left
        return True
    with contextlib.suppress(FrameError, ConnectionClosed, OSError):
        FrameSocket(connection, HELLO_LIMIT).receive(deadline)
    _refuse(
        connection,
        "engine_unavailable",
        "this agent serves TLS, and the host connected without it",
        {"reason": "tls"},
    )
    return False


def _refuse(
    connection: socket.socket, code: str, message: str, detail: Mapping[str, object]
) -> None:
    with contextlib.suppress(OSError):
        connection.sendall(
            encode("refused", {"code": code, "message": message, "detail": dict(detail)})
        )
