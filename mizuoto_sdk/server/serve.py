"""Run the app under uvicorn: listen, write ``server.json``, serve until stopped, clean up.

The socket is bound before ``server.json`` is written, so a command that finds the file can
connect (a request that comes before uvicorn accepts waits in the listen backlog). On a clean
stop (SIGINT, SIGTERM: uvicorn finishes the requests in flight for up to ``GRACE`` seconds) the
file is removed and every model unloaded; a server that is killed leaves a stale file, which
``record.live_record`` recognises by its pid and the next ``serve`` replaces.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from mizuoto_sdk.host import RuntimeService
from mizuoto_sdk.server.record import ServerRecord, record_path, remove_record, write_record
from mizuoto_sdk.server.stream import StreamCut

log = logging.getLogger(__name__)

GRACE = 5
"""Seconds a stopping server gives the requests in flight before it closes their connections."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: a free port); OSError if it is taken.

    Its protocol is named (``IPPROTO_TCP``), not left 0: asyncio turns Nagle's algorithm off
    (TCP_NODELAY) only on sockets that say they are TCP, and a stream's small chunks would
    otherwise wait up to 40 ms each for the client's delayed acknowledgement.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def run_server(
    service: RuntimeService,
    sock: socket.socket,
    *,
    token: str | None,
    version: str,
    home: Path | None = None,
    announce: Callable[[ServerRecord, Path], None] | None = None,
) -> None:
    """Serve ``service`` on ``sock`` until a signal stops the server; ``server.json`` goes into
    ``home`` (default: the data folder) while it runs. ``announce`` is told where it listens."""
    import uvicorn

    from mizuoto_sdk.server.app import create_app

    host, port = sock.getsockname()[:2]
    loopback = is_loopback(host)
    address = host
    if ipaddress.ip_address(host).is_unspecified:  # every interface: local commands use loopback
        address = "::1" if sock.family == socket.AF_INET6 else "127.0.0.1"
    if ":" in address:
        address = f"[{address}]"
    record = ServerRecord(
        url=f"http://{address}:{port}",
        host=host,
        port=port,
        pid=os.getpid(),
        version=version,
        token=token,
        started=time.time(),
    )
    path = record_path(home)
    voices = path.parent / "voices"
    app = create_app(service, token=token, loopback=loopback, version=version, voices=voices)
    config = uvicorn.Config(
        app,
        log_level="info",
        timeout_graceful_shutdown=GRACE,
        lifespan="off",
        server_header=False,
    )
    write_record(record, path)
    quiet = _QuietCuts()
    logging.getLogger("uvicorn.error").addFilter(quiet)
    try:
        if announce is not None:
            announce(record, path)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        remove_record(record.pid, path)
        logging.getLogger("uvicorn.error").removeFilter(quiet)
        service.close()
        sock.close()


class _QuietCuts(logging.Filter):
    """Drops uvicorn's traceback of a stream that ended as expected: cut after an engine error
    (``stream.py`` has logged it in one line) or cancelled when a stop outlasts ``GRACE`` (uvicorn
    has said so in one line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, (StreamCut, asyncio.CancelledError))
