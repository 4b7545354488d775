"""resources.no_threads, at import: importing the module starts a background thread (a cache
warmer) that nothing stops; a check that counts threads around load alone never sees it."""

from __future__ import annotations

import threading

from mizuoto_broken.base import BaseEngine

THREAD_NAME = "mizuoto-broken-cache-warmer"
_STOP = threading.Event()


def _warm() -> None:
    _STOP.wait(timeout=60.0)  # bounded: it ends by itself even if nobody stops it


# The breakage: started when the module is imported, before any load, and never joined.
threading.Thread(target=_warm, name=THREAD_NAME, daemon=True).start()


class Engine(BaseEngine):
    pass


def restore() -> None:
    """End the thread now."""
    _STOP.set()
    for thread in threading.enumerate():
        if thread.name == THREAD_NAME:
            thread.join(timeout=2.0)
