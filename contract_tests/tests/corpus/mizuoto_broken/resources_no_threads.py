"""resources.no_threads: load starts a warm-up thread that unload never stops."""

from __future__ import annotations

import threading

from mizuoto_broken.base import BaseEngine

THREAD_NAME = "mizuoto-broken-warm-up"
_RELEASE = threading.Event()


def _warm_up() -> None:
    # A module-level function, so that the thread does not keep the model alive; bounded, so
    # that it ends by itself even if nobody releases it.
    _RELEASE.wait(timeout=5.0)


class Engine(BaseEngine):
    def load(self, spec, runtime, ctx):
        threading.Thread(target=_warm_up, name=THREAD_NAME, daemon=True).start()  # the breakage
        return super().load(spec, runtime, ctx)


def restore() -> None:
    """End the warm-up threads now."""
    _RELEASE.set()
    for thread in threading.enumerate():
        if thread.name == THREAD_NAME:
            thread.join(timeout=2.0)
    _RELEASE.clear()
