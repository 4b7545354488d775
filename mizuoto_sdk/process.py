"""How a command-line process stops: on a signal, cleanly; when its work is done, promptly.

A command runs plugin and engine code it does not control. Two things follow:

- SIGTERM (and SIGHUP) are turned into ``Terminated``, a KeyboardInterrupt, so that they unwind the
  command exactly as Ctrl-C does: ``with`` blocks remove unfinished files, discovery lets them
  through rather than recording a failed plugin, and the host's ``except Exception`` never
  swallows them. The process then prints one line (no traceback) and ends *by that signal*, as
  Python itself does for an unhandled KeyboardInterrupt, so that a shell or a supervisor sees how
  it ended.
- Python's normal exit waits for every non-daemon thread, and a plugin may have started one that
  never ends. When the command returns and such threads are left, the process runs its exit
  handlers, flushes its output and ends without waiting for them (with a warning naming them);
  otherwise it exits normally.

Only an executable's entry point calls ``run_command``: it sets signal handlers, which belong to
the process. ``main`` functions stay callable from other programs without any of this.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

log = logging.getLogger(__name__)

_STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)


class Terminated(KeyboardInterrupt):
    """The process was asked to stop by a signal other than SIGINT; unwinds like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


def run_command(main: Callable[[], int], name: str) -> NoReturn:
    """Run ``main`` as this process's command and end the process with its exit code."""
    for signum in _STOP_SIGNALS:
        if signal.getsignal(signum) == signal.SIG_DFL:  # one ignored on purpose (nohup) stays so
            signal.signal(signum, _raise_terminated)
    try:
        code = main()
        sys.stdout.flush()  # here, where a closed pipe can still be handled
    except BrokenPipeError:
        _end(_reader_gone(), None)
    except KeyboardInterrupt as stop:
        signum = stop.signum if isinstance(stop, Terminated) else signal.SIGINT
        for ignored in (signal.SIGINT, *_STOP_SIGNALS):  # a second signal must not interrupt this
            signal.signal(ignored, signal.SIG_IGN)
        said = "interrupted" if signum == signal.SIGINT else "terminated"
        _say(f"{name}: {said}")
        _end(128 + signum, signum)
    _end(code, None)


def _reader_gone() -> int:
    """The reader of standard output went away (``mizuoto settings | head -1``): say nothing
    more on it, as a shell tool does, and fail with 1 (Python's own convention for this)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the exit's own flush must not fail again
    return 1


def _say(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # stderr may be closed (a hung-up terminal)
        print(line, file=sys.stderr, flush=True)


def _stray_threads() -> list[threading.Thread]:
    main = threading.main_thread()
    return [t for t in threading.enumerate() if t is not main and not t.daemon and t.is_alive()]


def _end(code: int, signum: int | None) -> NoReturn:
    stray = _stray_threads()
    if signum is None and not stray:
        sys.exit(code)  # the ordinary exit: nothing left to wait for
    if stray:
        log.warning(
            "not waiting for thread(s) left running by a plugin or engine: %s",
            ", ".join(t.name for t in stray),
        )
    atexit._run_exitfuncs()  # what the process registered to clean up (logging flushes here)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if signum is not None:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(code)
