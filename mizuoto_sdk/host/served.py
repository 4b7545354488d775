"""One request in a worker process: the model's call, run on a thread of the worker.

A stream computes a chunk only once the parent allowed it (``next`` frames: the caller asked for
chunk ``k``, so the worker may compute up to ``k + 1``). In a replica of one rank, a cancel or a
closed stream reaches the engine at once, through the request. In a replica of several ranks the
engine's collectives must stay in step, so the output rank decides at each chunk boundary whether
to go on (``Lockstep``) and only it talks to the parent; a cancel, a timeout or a close then stops
every rank at the same boundary, and a call that is not a stream runs to its end.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from mizuoto_sdk.errors import CancelledError, EngineError, OperationTimeoutError
from mizuoto_sdk.frames import Frame, audio_from_fields, chunk_frame, encode, error_frame
from mizuoto_sdk.host.lockstep import CANCELLED, CLOSED, GO, TIMED_OUT, Lockstep
from mizuoto_sdk.request import EngineRequest

if TYPE_CHECKING:
    from mizuoto_sdk.host.model import LocalModel

STREAMS = ("synthesize", "convert", "edit")


class ServedRequest:
    """A request frame from the parent, answered by ``run`` and ``finish``."""

    def __init__(
        self,
        frame: Frame,
        model: LocalModel,
        send: Callable[[bytes], None],
        lockstep: Lockstep | None = None,
    ) -> None:
        header = frame.header
        self.id = int(header["id"])
        self._header, self._payload = header, frame.payload
        self._model, self._lockstep = model, lockstep
        self._output = lockstep is None or lockstep.output
        self._send = send if self._output else _silent
        # The request asks for chunk 0 and allows chunk 1; each "next" allows one more.
        self._credit = threading.Semaphore(2)
        self._last = b""  # the frame that ends the answer (end, result or error)
        self._closing = False
        self._cancelled = False  # ranks in step: stop at the next chunk boundary
        timeout = header.get("timeout")
        self._deadline: float | None = None
        self.request = EngineRequest(
            params=dict(header.get("params") or {}),
            # ranks in step: the output rank times the request out between chunks instead
            timeout=timeout if lockstep is None else None,
            text_input=queue.Queue() if header.get("text_input") else None,
            progress=self._progress,
        )
        self._timeout = timeout if lockstep is not None else None

    def handle(self, frame: Frame) -> None:
        """A frame about this request from the parent: next, cancel, close or text."""
        if frame.kind == "next":
            self._credit.release()
        elif frame.kind in ("cancel", "close"):
            self._closing = self._closing or frame.kind == "close"
            if self._lockstep is None:  # the engine stops at its next check_cancel
                self.request.cancel()
            else:  # the output rank stops every rank at the next chunk boundary
                self._cancelled = True
            self._credit.release()
        elif frame.kind == "text" and self.request.text_input is not None:
            self.request.text_input.put(frame.header.get("text"))

    def stop(self) -> None:
        """The worker stops: end the request as a ``close`` from the parent would."""
        self.handle(Frame("close", {"id": self.id}, b""))

    def run(self) -> None:
        """Answer the request; its last frame waits for ``finish``."""
        self._send(encode("started", {"id": self.id}))
        if self._timeout is not None:
            self._deadline = time.monotonic() + float(self._timeout)
        try:
            self._answer()
        except EngineError as error:
            self._last = error_frame(error, id=self.id, **self._written_back())
        except Exception as error:  # the host maps engine errors; this is the worker's own
            failed = EngineError(f"the worker failed: {type(error).__name__}: {error}")
            self._last = error_frame(failed, id=self.id, **self._written_back())

    def finish(self) -> None:
        """Send the last frame (once the request's thread is idle again: see the worker)."""
        self._send(self._last)

    def _answer(self) -> None:
        header, model, capability = self._header, self._model, self._header["capability"]
        text = header.get("text")
        audio = audio_from_fields(header["audio"], self._payload) if "audio" in header else None
        inputs = {"synthesize": (text,), "convert": (audio,), "edit": (audio, text)}
        if capability in STREAMS:
            self._stream(getattr(model, capability)(*inputs[capability], request=self.request))
        elif capability == "collect":
            chunk = model.collect(header["of"], *inputs[header["of"]], request=self.request)
            self._send(chunk_frame(chunk, id=self.id))
            self._last = encode("end", {"id": self.id, **self._written_back()})
        elif capability == "prepare_voice":
            assert audio is not None
            value = model.prepare_voice(audio, header["voice_dir"], request=self.request)
            self._result(value)
        else:
            self._result(model.call(header["op"], header.get("arguments"), request=self.request))

    def _stream(self, chunks: Iterator[Any]) -> None:
        decision = GO
        try:
            for index in range(1 << 62):
                if self._output:
                    self._credit.acquire()
                decision = self._decide()
                if decision != GO:
                    break
                chunk = next(chunks, None)
                if chunk is None:
                    break
                self._send(chunk_frame(chunk, id=self.id, index=index))
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        if decision == CANCELLED:
            raise CancelledError("cancelled between chunks", {"reason": "cancelled"})
        if decision == TIMED_OUT:
            raise OperationTimeoutError(
                f"ran past its timeout of {self._timeout} s", {"timeout": self._timeout}
            )
        self._last = encode("end", {"id": self.id, **self._written_back()})

    def _decide(self) -> int:
        """Go on with the next chunk, or stop (and why): the output rank's call, on every rank."""
        if self._closing:
            decision = CLOSED
        elif self._cancelled:
            decision = CANCELLED
        elif self._deadline is not None and time.monotonic() >= self._deadline:
            decision = TIMED_OUT
        else:
            decision = GO
        return decision if self._lockstep is None else self._lockstep.agree(decision)

    def _result(self, value: object) -> None:
        try:
            encoded = json.loads(json.dumps(value))
        except (TypeError, ValueError) as error:
            raise EngineError(
                f"the engine's result cannot leave a worker process: JSON only ({error})",
                {"reason": "result_not_json"},
            ) from None
        self._last = encode("result", {"id": self.id, "value": encoded, **self._written_back()})

    def _written_back(self) -> dict[str, object]:
        request = self.request
        return {
            "applied": json_safe(request.applied),
            "warnings": [str(w) for w in request.warnings],
            "timings": json_safe(request.timings),
        }

    def _progress(self, done: float, total: float | None, message: str | None) -> None:
        fields = {"id": self.id, "done": done, "total": total, "message": message}
        self._send(encode("progress", fields))


def json_safe(value: Mapping[str, object]) -> dict[str, Any]:
    """``value`` as JSON holds it (what JSON cannot hold becomes its ``str``)."""
    return dict(json.loads(json.dumps(dict(value), default=str)))


def _silent(data: bytes) -> None:
    """A rank that is not the output rank says nothing about its requests."""
