"""Frames over a socket: protocol 2's transport, for TCP and TLS alike.

A frame is ``mizuoto_sdk.frames``'s: a 4-byte big-endian length, then the kind, the header and
the payload. The length is read first and checked against the socket's ``limit`` before a byte of
the body is read, so a peer cannot make the reader allocate more than the limit; a read may be
given a deadline for the whole frame, so a peer cannot hold it open a byte at a time.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Mapping

from mizuoto_sdk.frames import Frame, FrameError, decode, encode

__all__ = [
    "MAX_REMOTE_FRAME",
    "PROTOCOL",
    "ConnectionClosed",
    "FrameSocket",
    "OversizedFrame",
    "PeerSpeaksTLS",
    "looks_like_tls",
]

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


class OversizedFrame(FrameError):
    """A frame longer than the connection's limit; its body was not read, so nothing after it
    can be read either."""


class PeerSpeaksTLS(OversizedFrame):
    """What came instead of a frame's length is the start of a TLS record: the peer expects TLS
    on a connection this side opened without it."""


def looks_like_tls(data: bytes) -> bool:
    """Whether ``data`` begins as a TLS record does (content type 20-23, version 3.x). No frame
    over a connection begins so: its length would be over 300 MiB, past any connection's limit."""
    return len(data) >= 3 and 20 <= data[0] <= 23 and data[1] == 3 and data[2] <= 4


class FrameSocket:
    """Frames over one connected socket (plain or TLS).

    ``send`` may be called from several threads (each frame goes out whole); ``receive`` from
    one reader at a time. ``receive`` raises ``FrameError`` for a malformed frame or one longer
    than ``limit`` (``PeerSpeaksTLS`` for a TLS record) and ``ConnectionClosed`` at end of file;
    a socket timeout or another OS error comes out as it is.
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

    def receive(self, deadline: float | None = None) -> Frame:
        """The next frame. With a ``deadline`` (``time.monotonic()``) the whole frame must have
        arrived by then (``TimeoutError``), however slowly its bytes come; this sets the
        socket's timeout, which the caller resets afterwards."""
        if deadline is not None:
            self._time_left(deadline)
        if self._tls:
            self._wait_readable()
        with self._io_lock:
            prefix = self._read(_LENGTH.size, at_boundary=True, deadline=deadline)
            (size,) = _LENGTH.unpack(prefix)
            if size > self.limit:
                if looks_like_tls(prefix):
                    raise PeerSpeaksTLS("the peer answered with a TLS record, not a frame")
                raise OversizedFrame(
                    f"a frame of {size} bytes is over this connection's limit of {self.limit}"
                )
            return decode(prefix + self._read(size, at_boundary=False, deadline=deadline))

    def _time_left(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out waiting for a frame")
        self.socket.settimeout(left)

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

    def _read(self, size: int, *, at_boundary: bool, deadline: float | None) -> bytes:
        data = bytearray()
        while len(data) < size:
            if deadline is not None:
                self._time_left(deadline)
            piece = self.socket.recv(min(size - len(data), 1 << 20))
            if not piece:
                where = "between frames" if at_boundary and not data else "inside a frame"
                raise ConnectionClosed(f"the peer closed the connection {where}")
            data += piece
        return bytes(data)
