"""Run the app under uvicorn: listen, write ``server.json``, serve until stopped, clean up.

The socket is bound before ``server.json`` is written, so a command that finds the file can
connect (a request that comes before uvicorn accepts waits in the listen backlog). A clean stop
(SIGINT, SIGTERM) first ends the work in flight, then the connections: the server stops
accepting, takes no new work, cancels every synthesis and every other call in flight and waits
up to the setting ``host.stop_timeout`` (10 s) for their engines to unwind (their ``finally``
blocks run, the children they started die), and only then lets uvicorn close the connections,
within ``GRACE`` seconds. The file is then removed, every model unloaded, and any child an
engine left running killed; a server that is killed leaves a stale file, which
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
from typing import TYPE_CHECKING

from mizuoto_runtime.process import kill_children
from mizuoto_sdk.host import RuntimeService
from mizuoto_sdk.server.limits import REQUEST_TIMEOUT, head_deadline
from mizuoto_sdk.server.record import ServerRecord, record_path, remove_record, write_record
from mizuoto_sdk.server.stream import StreamCut

if TYPE_CHECKING:
    import uvicorn

    from mizuoto_sdk.server.stream import Feeds

log = logging.getLogger(__name__)

GRACE = 5
"""Seconds a stopping server gives its connections to end once the work in flight has ended."""


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
    tls: tuple[Path, Path] | None = None,
) -> None:
    """Serve ``service`` on ``sock`` until a signal stops the server, then close ``service``;
    ``server.json`` goes into ``home`` (default: the data folder) while it runs. ``announce`` is
    told where it listens. ``tls``: (certificate, key) files, to serve HTTPS; the record then
    says ``https://`` and names the certificate, which the local commands trust."""
    import uvicorn

    from mizuoto_sdk.server.app import create_app

    host, port = sock.getsockname()[:2]
    loopback = is_loopback(host)
    address = host
    if ipaddress.ip_address(host).is_unspecified:  # every interface: local commands use loopback
        address = "::1" if sock.family == socket.AF_INET6 else "127.0.0.1"
    if ":" in address:
        address = f"[{address}]"
    if not loopback and tls is None:
        log.warning(
            "serving on %s without TLS: the token, and every request, travel in clear; give "
            "--tls-cert and --tls-key to serve HTTPS",
            host,
        )
    scheme = "http" if tls is None else "https"
    record = ServerRecord(
        url=f"{scheme}://{address}:{port}",
        host=host,
        port=port,
        pid=os.getpid(),
        version=version,
        token=token,
        started=time.time(),
        tls_cert=None if tls is None else os.fspath(tls[0].resolve()),
    )
    path = record_path(home)
    app = create_app(service, token=token, loopback=loopback, version=version, home=path.parent)
    config = uvicorn.Config(
        app,
        http=head_deadline(REQUEST_TIMEOUT),  # h11, with a deadline for each request's head
        log_level="info",
        timeout_graceful_shutdown=GRACE,
        lifespan="off",
        server_header=False,
        ssl_certfile=None if tls is None else os.fspath(tls[0]),
        ssl_keyfile=None if tls is None else os.fspath(tls[1]),
    )
    write_record(record, path)
    quiet = _QuietCuts()
    logging.getLogger("uvicorn.error").addFilter(quiet)
    try:
        if announce is not None:
            announce(record, path)
        _server(config, lambda: _end_work(app.state.feeds, service)).run(sockets=[sock])
    finally:
        remove_record(record.pid, path)
        logging.getLogger("uvicorn.error").removeFilter(quiet)
        service.close(0)  # after _end_work: what is left is idle
        kill_children()  # what an engine that outlasted the stop left running
        sock.close()


def _end_work(feeds: Feeds, service: RuntimeService) -> None:
    """Cancel every synthesis and every other call in flight and wait up to the setting
    ``host.stop_timeout`` for them to unwind. The streams are cancelled first, so that each
    closes its engine stream on its own thread, then the service stops every call (the streams'
    among them) and waits for them."""
    grace = float(service.settings.get("host.stop_timeout"))
    deadline = time.monotonic() + grace
    feeds.stop()
    left = service.close(grace)
    streams = feeds.wait(deadline)
    if streams or left:
        log.warning(
            "%d stream(s) and the calls of %s had not ended %.1f s after the stop: left to the "
            "process's exit",
            streams,
            ", ".join(left) or "no model",
            grace,
        )


def _server(config: uvicorn.Config, end_work: Callable[[], None]) -> uvicorn.Server:
    """uvicorn's server, whose shutdown ends the work in flight before it waits for connections
    (uvicorn alone would wait ``GRACE`` seconds for streams that only end when cancelled, then
    cancel their tasks without waiting for the engines behind them)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            for server in self.servers:  # no new connection while the work ends
                server.close()
            await asyncio.to_thread(end_work)
            await super().shutdown(sockets)

    return Server(config)


class _QuietCuts(logging.Filter):
    """Drops uvicorn's traceback of a stream that ended as expected: cut after an engine error
    (``stream.py`` has logged it in one line) or cancelled when a stop outlasts ``GRACE`` (uvicorn
    has said so in one line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, (StreamCut, asyncio.CancelledError))
