"""resources.no_temp_files, a socket: every call opens a status port on 127.0.0.1 (for a
monitor that never comes) and never closes it."""

from __future__ import annotations

import socket

from mizuoto_broken.base import BaseEngine, BaseLoaded

_OPEN: list[socket.socket] = []


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        status = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        status.bind(("127.0.0.1", 0))
        status.listen(1)
        _OPEN.append(status)  # the breakage: never closed
        yield from super().synthesize(text, params, ctx)


class Engine(BaseEngine):
    LOADED = Loaded


def restore() -> None:
    """Close the sockets this process opened."""
    while _OPEN:
        _OPEN.pop().close()
