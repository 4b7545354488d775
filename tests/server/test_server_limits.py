"""What one request may make the server hold (``mizuoto_sdk.server.limits``): a JSON body's size,
and how long a request's head may take to arrive."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
from server_support import RunningServer

from mizuoto_sdk.server.limits import MAX_JSON_BODY, BodyLimit, head_deadline


def raw_answer(sock: socket.socket) -> tuple[int, dict[str, object]]:
    """The status and JSON body of the HTTP answer read from ``sock`` (its content-length)."""
    received = b""
    while b"\r\n\r\n" not in received:
        part = sock.recv(65536)
        assert part, f"the connection closed before an answer: {received!r}"
        received += part
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(body) < int(headers["content-length"]):
        part = sock.recv(65536)
        assert part, "the connection closed in the middle of the answer"
        body += part
    return int(lines[0].split()[1]), json.loads(body)


def test_a_json_body_past_the_limit_is_refused_without_being_read(server: RunningServer) -> None:
    """A declared length past MAX_JSON_BODY is answered at once: the server never waits for
    (nor holds) the 64 MiB the client says it will send."""
    with socket.create_connection(("127.0.0.1", int(server.record["port"])), timeout=30) as sock:
        head = b"POST /api/v1/synthesize HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        head += b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % (64 * 2**20)
        sock.sendall(head + b'{"engine": "sine", "text": "')
        status, error = raw_answer(sock)
    assert status == 413, error
    assert error["code"] == "request_too_large"
    assert error["detail"] == {"field": "body", "limit_bytes": MAX_JSON_BODY}
    assert str(MAX_JSON_BODY) in str(error["message"])


def test_an_undeclared_json_body_is_read_no_further_than_the_limit() -> None:
    """A chunked body (no declared length) is refused as soon as it passes the limit: the app
    never sees it and the rest is never asked for."""
    pulled = 0
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b"x" * 100, "more_body": True}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    async def app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("the app saw a body past the limit")

    scope = {"type": "http", "path": "/api/v1/synthesize", "headers": []}
    asyncio.run(BodyLimit(app, limit=1000)(scope, receive, send))  # type: ignore[arg-type]
    assert pulled == 11  # 1100 bytes: the first read past 1000
    assert sent[0]["status"] == 413
    error = json.loads(sent[1]["body"])  # type: ignore[arg-type]
    assert error["code"] == "request_too_large" and error["detail"]["limit_bytes"] == 1000


HEAD_TIMEOUT = 1.0  # seconds: short, so that the test is; what is checked is that it ends


@pytest.fixture
def deadline_server() -> Iterator[int]:
    """uvicorn in this process with the server's protocol and a head deadline of HEAD_TIMEOUT,
    over a tiny app; its port."""
    import uvicorn

    from mizuoto_sdk.server.serve import listen

    async def app(
        scope: dict[str, object],
        receive: object,
        send: Callable[[dict[str, object]], Awaitable[None]],
    ) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sock = listen("127.0.0.1", 0)
    config = uvicorn.Config(
        app, http=head_deadline(HEAD_TIMEOUT), lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:  # bounded: uvicorn starts in well under 30 s
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def test_a_request_head_that_does_not_arrive_whole_in_time_is_dropped(deadline_server: int) -> None:
    """A connection that says nothing, and a kept-alive one that sends half of its next request,
    are each answered 408 and closed once the deadline passes (uvicorn alone keeps them open)."""
    address = ("127.0.0.1", deadline_server)
    with (
        socket.create_connection(address, timeout=30) as silent,
        socket.create_connection(address, timeout=30) as halfway,
    ):
        halfway.sendall(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        assert halfway.recv(65536).startswith(b"HTTP/1.1 204 ")  # a whole head is answered
        halfway.sendall(b"GET / HTTP/1.1\r\nhost: 127.0")
        for connection in (silent, halfway):
            status, error = raw_answer(connection)
            assert status == 408, error
            assert error["code"] == "request_timeout"
            assert error["detail"] == {"limit_seconds": HEAD_TIMEOUT}
            assert connection.recv(1) == b"", "the connection stayed open"
