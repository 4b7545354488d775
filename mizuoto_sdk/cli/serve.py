"""``mizuoto serve``: the HTTP API and the web page over this machine's engines (the ``server``
extra: FastAPI and uvicorn), until Ctrl-C or SIGTERM.

It listens on loopback unless told otherwise. Bound beyond loopback it checks a token on every
request: the one in ``--token-file``, else a new random one, written into ``server.json`` (readable
by its owner only) and shown in the page's address it prints. ``--tls-cert``/``--tls-key`` serve
HTTPS; beyond loopback without them, it warns that the token travels in clear.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

from mizuoto_sdk.cli.agent import read_token
from mizuoto_sdk.cli.common import Usage
from mizuoto_sdk.cli.settings import add_set_option, host_settings
from mizuoto_sdk.server.record import ServerLock, ServerRecord

DEFAULT_PORT = 7370
_TOKEN_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=")
EXTRA = 'pip install "mizuoto-sdk[server]"'


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve_ = commands.add_parser(
        "serve", help="serve the engines over HTTP (API and web page) until stopped"
    )
    serve_.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on; default: 127.0.0.1 (this machine only); any other "
        "address needs a token on every request",
    )
    serve_.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"the port; 0: a free one (server.json says which); default: {DEFAULT_PORT}",
    )
    serve_.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="require the secret in FILE on every request; default: none on loopback, a new "
        "random token (kept in server.json) on any other address",
    )
    serve_.add_argument(
        "--tls-cert",
        type=Path,
        metavar="FILE",
        help="serve HTTPS with this certificate (PEM); server.json then says https:// and "
        "names it, and the local commands trust it",
    )
    serve_.add_argument("--tls-key", type=Path, metavar="FILE", help="the certificate's key")
    add_set_option(serve_)
    serve_.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    from mizuoto_sdk.server.client import find_server

    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise Usage(
            f"mizuoto serve needs the server extra ({error.name} is missing): {EXTRA}"
        ) from None
    from mizuoto_sdk.cli import _version  # here: the package imports this module
    from mizuoto_sdk.host import RuntimeService
    from mizuoto_sdk.server.serve import listen, run_server

    if not 0 <= args.port <= 65535:
        raise Usage(f"--port {args.port}: expected 0 to 65535")
    token = server_token(args.host, args.token_file)
    tls = tls_files(args.tls_cert, args.tls_key)
    _writable_data_folder()
    settings = host_settings(args.set)
    lock = ServerLock()
    if not lock.acquire():  # another server of this data folder runs, or is starting
        running, _ = find_server()
        where = f"at {running.url}" if running is not None else f"(it holds {lock.path})"
        raise Usage(f"a server already runs {where}: stop it first, or set another MIZUOTO_HOME")
    try:
        try:
            sock = listen(args.host, args.port)
        except OSError as error:
            raise Usage(
                f"--host {args.host} --port {args.port}: cannot listen: {error.strerror or error}"
            ) from None
        _log_to_stderr()
        # run_server closes the service: its stop has already given the calls their time
        run_server(
            RuntimeService(settings=settings),
            sock,
            token=token,
            version=_version(),
            announce=_announce,
            tls=tls,
        )
    finally:
        lock.release()
    return 0


def server_token(host: str, token_file: Path | None) -> str | None:
    """The token every request must carry: ``token_file``'s, else a new one unless ``host`` is
    loopback (where a server needs none)."""
    from mizuoto_sdk.server.serve import is_loopback

    if token_file is not None:
        token = read_token(token_file)
        if not set(token) <= _TOKEN_BYTES:
            raise Usage(
                f"--token-file {token_file}: use letters, digits and -._~+/= only (it travels "
                "in an HTTP header)"
            )
        return token.decode()
    return None if is_loopback(host) else secrets.token_urlsafe(32)


def tls_files(cert: Path | None, key: Path | None) -> tuple[Path, Path] | None:
    """The certificate and its key, checked to load together; None: no TLS."""
    if (cert is None) != (key is None):
        raise Usage("--tls-cert and --tls-key go together: give both, or neither")
    if cert is None or key is None:
        return None
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as error:
        raise Usage(f"--tls-cert {cert} --tls-key {key}: cannot be loaded: {error}") from None
    return cert, key


def _announce(record: ServerRecord, path: Path) -> None:
    page = f"{record.url}/?token={record.token}" if record.token else f"{record.url}/"
    print(f"mizuoto server at {record.url} (pid {record.pid})", file=sys.stderr)
    print(f"  the page: {page}", file=sys.stderr)
    print(f"  server.json: {path}; stop with Ctrl-C", file=sys.stderr, flush=True)


def _writable_data_folder() -> None:
    """The data folder takes server.json (and voices): checked before anything listens."""
    import os

    from mizuoto_sdk.server.record import record_path

    folder = record_path().parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise Usage(
            f"the data folder {folder} cannot be made: {error.strerror or error} "
            "(MIZUOTO_HOME names another)"
        ) from None
    if not os.access(folder, os.W_OK):
        raise Usage(f"the data folder {folder} is not writable (MIZUOTO_HOME names another)")


def _log_to_stderr() -> None:
    """The host's and the engines' log lines beside uvicorn's, from INFO up: a server's log is
    where an operator learns what happened to a request (a client gone, a stream cut)."""
    import logging

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
