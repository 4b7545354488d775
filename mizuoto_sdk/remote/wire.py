"""Frames over a socket: protocol 2's transport, for TCP and TLS alike.

A frame is ``mizuoto_sdk.frames``'s: a 4-byte big-endian length, then the kind, the header and
the payload. The length is read first and checked against the socket's ``limit`` before a byte of
the body is read, so a peer cannot make the reader allocate more than the limit.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import struct
import threading
from collections.abc import Mapping

from mizuoto_sdk.frames import Frame, FrameError, decode, encode

__all__ = ["MAX_REMOTE_FRAME", "PROTOCOL", "ConnectionClosed", "FrameSocket"]

PROTOCOL = 2
"""The remote protocol's version; host and agent of different versions refuse each other."""
FILE_CHUNK = 8 << 20
"""The most bytes of a file one ``put`` or ``file`` frame carries (8 MiB)."""
MAX_REMOTE_FRAME = (16 << 20) + (64 << 10)
"""The largest frame read from a peer by default (16 MiB + 64 KiB): a file chunk and its header
fit with room to spare."""

_LENGTH = struct.Struct(">I")


class ConnectionClosed(EOFError):
    """The peer closed the connection (at a frame boundary or inside one)."""


class FrameSocket:
    """Frames over one connected socket (plain or TLS).

    ``send`` may be called from several threads (each frame goes out whole); ``receive`` from
    one reader at a time. ``receive`` raises ``FrameError`` for a malformed frame or one longer
    than ``limit`` and ``ConnectionClosed`` at end of file; a socket timeout or another OS error
    comes out as it is.
    """

    def __init__(self, sock: socket.socket, limit: int = MAX_REMOTE_FRAME) -> None:
        self.socket = sock
        self.limit = limit
        self._send_lock = threading.Lock()
        # One TLS connection is one OpenSSL object, which must not read and write at once from
        # two threads: there, a frame is read (once bytes are waiting) and written under one lock.
        self._tls = isinstance(sock, ssl.SSLSocket)
        self._io_lock = self._send_lock if self._tls else contextlib.nullcontext()

    def send(self, kind: str, header: Mapping[str, object], payload: bytes = b"") -> None:
        data = encode(kind, header, payload)
        with self._send_lock:
            self.socket.sendall(data)

    def receive(self) -> Frame:
        if self._tls:
            self._wait_readable()
        with self._io_lock:
            prefix = self._read(_LENGTH.size, at_boundary=True)
            (size,) = _LENGTH.unpack(prefix)
            if size > self.limit:
                raise FrameError(
                    f"a frame of {size} bytes is over this connection's limit of {self.limit}"
                )
            return decode(prefix + self._read(size, at_boundary=False))

    def _wait_readable(self) -> None:
        """Block, without the lock, until the TLS connection has bytes to read (or the socket's
        timeout passes: ``TimeoutError``, as a plain read would raise)."""
        tls = self.socket
        assert isinstance(tls, ssl.SSLSocket)
        if tls.pending():
            return
        try:
            readable, _, _ = select.select([tls], [], [], tls.gettimeout())
        except ValueError:  # closed by this side meanwhile (its descriptor is -1)
            raise ConnectionClosed("the connection was closed on this side") from None
        if not readable:
            raise TimeoutError("timed out waiting for a frame")

    def close(self) -> None:
        """Shut the connection down both ways (a reader blocked in ``receive`` wakes up with
        ``ConnectionClosed`` or ``OSError``) and close the socket; idempotent."""
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)
        self.socket.close()

    def _read(self, size: int, *, at_boundary: bool) -> bytes:
        data = bytearray()
        while len(data) < size:
            piece = self.socket.recv(min(size - len(data), 1 << 20))
            if not piece:
                where = "between frames" if at_boundary and not data else "inside a frame"
                raise ConnectionClosed(f"the peer closed the connection {where}")
            data += piece
        return bytes(data)
