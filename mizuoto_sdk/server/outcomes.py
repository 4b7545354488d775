"""How each recent synthesis ended, for a client whose stream was cut.

Once a streamed answer has begun its status cannot change, so an engine that fails mid-way can
only end the body early; a browser may not even hand over the audio it had. The answer's
``X-Mizuoto-Request`` id names the request, and ``GET /api/v1/requests/{id}`` says how it ended:
``streaming``, ``done``, ``cancelled`` or ``failed`` with the error. The last ``KEPT`` requests are
remembered; many request handlers record into one ``Outcomes`` at once.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from typing import Any

KEPT = 256


class Outcomes:
    """The last ``kept`` syntheses by id, newest last."""

    def __init__(self, kept: int = KEPT) -> None:
        self.kept = kept
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def begin(self, engine: str) -> str:
        """A new request's id; it is ``streaming`` until ``end``."""
        request_id = secrets.token_hex(8)
        with self._lock:
            self._entries[request_id] = {
                "id": request_id,
                "engine": engine,
                "model": None,
                "state": "streaming",
                "chunks": 0,
                "error": None,
            }
            while len(self._entries) > self.kept:
                self._entries.popitem(last=False)
        return request_id

    def end(self, request_id: str, state: str, **fields: Any) -> None:
        """Record how it ended (``done``, ``cancelled``, ``failed``) and what else is known."""
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is not None:
                entry.update(fields, state=state)

    def get(self, request_id: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self._entries.get(request_id)
            return None if entry is None else dict(entry)
