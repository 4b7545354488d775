"""Progress of a long call on stderr: a bar on a terminal, plain lines otherwise, a last line.

An engine reports ``ctx.progress(done, total, message)``; ``total`` None means the amount of work is
not known in advance (a decoder that stops at its end code). Nothing shows for a call shorter than
``delay`` seconds; once something has shown, ``finish`` prints one last line with what was done,
so a run never ends on a line that looks unfinished.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

_WIDTH = 24


class Progress:
    """A ``ProgressCallback`` for ``EngineRequest.progress`` that draws on ``stream``.

    On a terminal (``stream.isatty()``) one line is redrawn in place, at most every ``every``
    seconds; elsewhere (a log, a pipe) a plain line is written at most every ``every_line``
    seconds. ``clock`` is ``time.perf_counter`` unless a test gives another.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        delay: float = 0.5,
        every: float = 0.1,
        every_line: float = 2.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self._clock, self._start = clock, clock()
        self._delay = delay
        self._every = every if self.terminal else every_line
        self._last: float | None = None
        self._done: float = 0.0
        self._total: float | None = None
        self._message: str | None = None
        self._drawn = 0  # characters of the bar now on the terminal line

    def restart(self) -> None:
        """Count the time (and the ``delay``) from now: the work being shown starts here."""
        self._start = self._clock()

    @property
    def shown(self) -> bool:
        """Whether any progress has been printed (then ``finish`` prints a last line)."""
        return self._last is not None

    def __call__(self, done: float, total: float | None, message: str | None) -> None:
        self._done, self._total, self._message = done, total, message
        now = self._clock() - self._start
        if now < self._delay or (self._last is not None and now - self._last < self._every):
            return
        self._last = now
        self._write(self._line(now, final=False), final=False)

    def finish(self, summary: str | None = None) -> None:
        """The last line: what was done in how long (``summary`` replaces the amount), printed
        only when progress was shown; on a terminal it ends the redrawn line."""
        if not self.shown:
            return
        now = self._clock() - self._start
        line = f"done: {summary} ({now:.1f} s)" if summary else self._line(now, final=True)
        self._write(line, final=True)

    def abandon(self) -> None:
        """The call failed: end a bar left on the terminal line, so the error starts a line."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = 0

    def _line(self, now: float, *, final: bool) -> str:
        unit = f" {self._message}" if self._message else ""
        done = _amount(self._done)
        if final:
            return f"done: {done}{unit} ({now:.1f} s)"
        if not self._total:
            return f"progress {done}{unit} ({now:.1f} s)"
        share = min(max(self._done / self._total, 0.0), 1.0)
        amount = f"{done}/{_amount(self._total)}{unit}"
        if not self.terminal:
            return f"progress {amount} {share:.0%} ({now:.1f} s)"
        filled = round(share * _WIDTH)
        bar = "#" * filled + "-" * (_WIDTH - filled)
        return f"[{bar}] {share:4.0%} {amount} ({now:.1f} s)"

    def _write(self, line: str, *, final: bool) -> None:
        if self.terminal:
            padding = " " * max(self._drawn - len(line), 0)  # clear what a longer line left
            self.stream.write(f"\r{line}{padding}" + ("\n" if final else ""))
            self._drawn = 0 if final else len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _amount(value: float) -> str:
    """A count as a person reads it: whole numbers whole (13230000, not 1.323e+07)."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.{max(3, len(str(int(value))))}g}"
