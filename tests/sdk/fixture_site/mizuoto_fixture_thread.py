"""A plugin module that starts a thread that never ends (not a daemon) when it is imported."""

import threading

from mizuoto_sdk import hookimpl

_never = threading.Event()
threading.Thread(target=_never.wait, name="fixture-plugin-thread", daemon=False).start()


@hookimpl
def mizuoto_engines():
    return []
