"""``mizuoto agent``: serve this machine's engines to hosts elsewhere (protocol 2, TCP or TLS).

The agent is a whole host: its own settings, data folder, models and runtime. A host whose
engine device is ``<name>/<device>`` connects to it (``remote.hosts.<name>.*``), and every call
runs here, in this process, exactly as on a local host. It listens on 127.0.0.1 unless told
otherwise, and refuses any connection whose first frame lacks the token in ``--token-file``.

On a stop (SIGTERM, SIGHUP, Ctrl-C) it stops accepting, answers each request in flight with
``engine_unavailable``, cancels it and waits up to ``host.stop_timeout`` seconds (10 s) in all for
the engines to unwind before the process ends.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mizuoto_sdk.cli.common import Usage
from mizuoto_sdk.cli.settings import add_set_option, host_settings

if TYPE_CHECKING:
    from mizuoto_sdk.host import RuntimeService
    from mizuoto_sdk.host.agent import Agent


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    agent_ = commands.add_parser(
        "agent", help="serve this machine's engines to Mizuoto hosts on other machines"
    )
    agent_.add_argument(
        "--listen",
        default="127.0.0.1:7373",
        metavar="HOST:PORT",
        help="where to listen (port 0: any free port, printed); default: 127.0.0.1:7373, this "
        "machine only: name an address other machines reach to serve them",
    )
    agent_.add_argument(
        "--token-file",
        type=Path,
        required=True,
        metavar="FILE",
        help="a file holding the secret every host must send first; required",
    )
    agent_.add_argument("--tls-cert", type=Path, metavar="FILE", help="serve TLS with this cert")
    agent_.add_argument("--tls-key", type=Path, metavar="FILE", help="the certificate's key")
    add_set_option(agent_)
    agent_.set_defaults(handler=agent)


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` as a pair; a usage error that names ``--listen`` otherwise."""
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise Usage(f"--listen {text!r}: expected HOST:PORT, such as 127.0.0.1:7373")
    return host.strip("[]"), int(port)


def read_token(path: Path) -> bytes:
    """The secret in ``path`` (surrounding whitespace dropped); a usage error if there is none."""
    try:
        token = path.read_bytes().strip()
    except OSError as error:
        raise Usage(f"--token-file {path}: cannot be read: {error.strerror or error}") from None
    if not token:
        raise Usage(f"--token-file {path} is empty: put a long random secret in it")
    return token


def _stop(server: Agent, service: RuntimeService) -> None:
    """Stop within ``host.stop_timeout`` in all: the sessions' requests first (answered,
    cancelled, unwound), then whatever else runs; the children of engines that outlasted it are
    killed, as the process is about to end."""
    from mizuoto_runtime.process import kill_children

    grace = float(service.settings.get("host.stop_timeout"))
    deadline = time.monotonic() + grace
    server.shutdown(grace)
    service.close(max(0.0, deadline - time.monotonic()))
    kill_children()
    if server.listening:
        print("mizuoto agent stopped", file=sys.stderr)


def agent(args: argparse.Namespace) -> int:
    import ssl

    from mizuoto_sdk.host import RuntimeService
    from mizuoto_sdk.host.agent import Agent

    host, port = listen_address(args.listen)
    token = read_token(args.token_file)
    context = None
    if (args.tls_cert is None) != (args.tls_key is None):
        raise Usage("--tls-cert and --tls-key go together: give both, or neither")
    if args.tls_cert is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as error:
            raise Usage(f"--tls-cert/--tls-key: cannot be loaded: {error}") from None
    service = RuntimeService(settings=host_settings(args.set))
    server = Agent(service, token, ssl_context=context)
    try:
        try:
            server.serve(host, port)
        except OSError as error:
            raise Usage(f"--listen {args.listen}: {error.strerror or error}") from None
        bound_host, bound_port = server.bound_address
        scheme = "tls" if context is not None else "tcp"
        print(f"mizuoto agent listening on {scheme}://{bound_host}:{bound_port}", flush=True)
        server.serve_forever()
    finally:
        _stop(server, service)
    return 0
