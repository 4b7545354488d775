"""Where an agent is and how to reach it: ``remote.hosts.<name>.*`` as one value.

``RemoteHost`` reads its token file when it connects (so a rotated token is picked up by the
next session) and, with ``tls``, verifies the agent's certificate against ``tls_ca`` (else the
system's certificates).
"""

from __future__ import annotations

import importlib.metadata
import socket
import ssl
from pathlib import Path

import attrs

from mizuoto_sdk.errors import InvalidRequest

__all__ = ["RemoteHost", "sdk_version"]


def sdk_version() -> str:
    """This installation's Mizuoto version, as a hello or ready names it."""
    try:
        return importlib.metadata.version("mizuoto-sdk")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@attrs.frozen
class RemoteHost:
    """An agent, as ``remote.hosts.<name>.*`` describe it."""

    name: str
    address: str
    """``HOST:PORT``."""
    token_file: str
    tls: bool = False
    tls_ca: str | None = None
    """The CA file that signed the agent's certificate; None: the system's."""
    heartbeat_timeout: float = 60.0
    load_timeout: float = 600.0
    """Seconds a session may take to connect, open the engine and load the model
    (``remote.load_timeout``)."""
    stop_timeout: float = 10.0
    """Seconds after a request's cancel or timeout before its caller is freed without the
    agent's answer (``host.stop_timeout``)."""

    def token(self) -> str:
        """The token in ``token_file``, read now (surrounding whitespace dropped)."""
        field = f"remote.hosts.{self.name}.token_file"
        try:
            token = Path(self.token_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidRequest(
                f"{field}: {self.token_file} cannot be read: {error}", {"field": field}
            ) from None
        if not token:
            raise InvalidRequest(f"{field}: {self.token_file} is empty", {"field": field})
        return token

    def connect(self) -> socket.socket:
        """A connected socket (TLS, the agent's certificate verified, when ``tls``)."""
        host, _, port = self.address.rpartition(":")
        host = host.strip("[]")
        sock = socket.create_connection((host, int(port)), timeout=self.heartbeat_timeout)
        # small frames (a chunk request, a cancel) go out at once, not held for an ACK (Nagle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self.tls:
            return sock
        try:
            context = ssl.create_default_context(cafile=self.tls_ca)
            return context.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
