"""``handle.submit(capability, *args)``: a call on a thread of the handle, as a standard Future."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from mizuoto_sdk.errors import EngineUnavailable, InvalidRequest
from mizuoto_sdk.request import EngineRequest

STREAMS = ("synthesize", "convert", "edit")
CAPABILITIES = (*STREAMS, "collect", "prepare_voice", "call")


class Submitter:
    """The threads behind one handle's ``submit``.

    A stream's future resolves to the list of its chunks. Only a call that has not begun can be
    cancelled through its future (``Future.cancel``); a running one stops through its request
    (``request.cancel()``). Closing cancels what is queued.
    """

    def __init__(self, handle: Any, workers: int, name: str) -> None:
        self._handle = handle
        self._workers = workers
        self._name = name
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def submit(
        self, capability: str, *arguments: object, request: EngineRequest | None = None
    ) -> Future[object]:
        if capability not in CAPABILITIES:
            raise InvalidRequest(
                f"capability: expected one of {', '.join(CAPABILITIES)}, got {capability!r}",
                {"field": "capability"},
            )
        method = getattr(self._handle, capability)
        with self._lock:
            if self._closed:
                raise EngineUnavailable(
                    f"{self._name} was closed; load it again", {"reason": "closed"}
                )
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._workers, f"mizuoto-{self._name}")
            if capability in STREAMS:
                return self._executor.submit(_chunks, method, arguments, request)
            return self._executor.submit(_value, method, arguments, request)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


def _chunks(method: Any, arguments: tuple[object, ...], request: EngineRequest | None) -> object:
    return list(method(*arguments, request=request))


def _value(method: Any, arguments: tuple[object, ...], request: EngineRequest | None) -> object:
    return method(*arguments, request=request)
