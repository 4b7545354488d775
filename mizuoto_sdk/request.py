"""What a caller hands the host with every engine call, and what it gets written back.

It lives in the contract layer so that the serving layer, which sends a request to another process,
reads and writes it without importing the host.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import attrs

ProgressCallback = Callable[[float, "float | None", "str | None"], None]
"""``progress(done, total, message)``: how far a call has come (the engine's ``ctx.progress``)."""


def _check_timeout(instance: EngineRequest, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"EngineRequest.timeout: expected seconds > 0 or None, got {value!r}")


@attrs.define
class EngineRequest:
    """One call's inputs besides the audio or text: params (``seed`` among them), cancel, limits.

    Set ``cancel_event`` (or call ``cancel()``) from any thread to stop the call; ``timeout`` is in
    seconds from the call's start. When the call ends the host fills ``applied``, ``warnings`` and
    ``timings`` (``first_chunk`` for streams, ``total`` always).
    """

    params: dict[str, Any] = attrs.field(factory=dict)
    cancel_event: threading.Event = attrs.field(factory=threading.Event)
    timeout: float | None = attrs.field(default=None, validator=_check_timeout)
    text_input: queue.Queue[str | None] | None = None
    progress: ProgressCallback | None = None
    applied: dict[str, Any] = attrs.field(factory=dict)
    warnings: list[str] = attrs.field(factory=list)
    timings: dict[str, float] = attrs.field(factory=dict)

    def cancel(self) -> None:
        self.cancel_event.set()
