"""A model of which this process is one rank, under an external launcher such as torchrun.

With ``engines.<id>.deployment = "external"`` every process the launcher started loads its rank's
part of the model and every one of them makes the same calls, as the script or command they all
run says. The output rank (rank 0) shares its request over torch.distributed, so every rank
computes the request rank 0 was given, in the same order, without the caller arranging it; rank 0
also decides at each chunk boundary whether to go on (``Lockstep``), so a cancel, a timeout or a
stream closed early stops every rank at the same place. Only the output rank's calls return
audio; on the other ranks a stream yields nothing and ``collect`` and ``call`` return None.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Generator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mizuoto_sdk.errors import CancelledError, OperationTimeoutError
from mizuoto_sdk.frames import audio_fields, audio_from_fields
from mizuoto_sdk.host.lockstep import CANCELLED, CLOSED, GO, TIMED_OUT, Lockstep
from mizuoto_sdk.request import EngineRequest
from mizuoto_sdk.serving.inputs import INPUTS
from mizuoto_sdk.serving.routing import ReplicaStatus
from mizuoto_sdk.serving.submit import Submitter

if TYPE_CHECKING:
    from mizuoto_runtime.parallel import Groups
    from mizuoto_sdk.host.model import LocalModel
    from mizuoto_sdk.types import AudioChunk


class ExternalModel:
    """This rank's part of a model whose ranks an external launcher started (``mode ==
    "external"``). Its calls are the handle's usual ones; every rank must make them, in the same
    order, as under any launcher of collectives."""

    mode = "external"

    def __init__(self, model: LocalModel, groups: Groups) -> None:
        self.model = model
        self.name = model.name
        self._groups = groups
        self._lockstep = Lockstep(groups)
        self._submitter = Submitter(self, workers=1, name=model.name)
        self._active = 0
        self._lock = threading.Lock()
        self.closed = False

    @property
    def output(self) -> bool:
        """Whether this process is the output rank, whose calls return the audio."""
        return self._lockstep.output

    @property
    def replicas(self) -> tuple[ReplicaStatus, ...]:
        """This rank of the one replica (the other ranks are other processes' to report)."""
        rank = self._groups.rank("world")
        return (
            (
                ReplicaStatus(
                    0,
                    not self.closed,
                    self._active,
                    (self.model.spec.device,),
                    (os.getpid(),),
                    "stopped" if self.closed else "ready",
                    None,
                ),
            )
            if rank == 0
            else ()
        )

    @property
    def description(self) -> dict[str, object]:
        return dict(self.model.description)

    def start(self) -> ExternalModel:
        self.model.start()
        return self

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._submitter.close()
        self.model.close()
        self._groups.close()

    def __enter__(self) -> ExternalModel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the calls ---------------------------------------------------------------------------

    def synthesize(
        self, text: str, request: EngineRequest | None = None
    ) -> Generator[AudioChunk, None, None]:
        return self._stream("synthesize", {"text": text}, None, request)

    def convert(
        self, audio: AudioChunk, request: EngineRequest | None = None
    ) -> Generator[AudioChunk, None, None]:
        return self._stream("convert", {}, audio, request)

    def edit(
        self, audio: AudioChunk, text: str, request: EngineRequest | None = None
    ) -> Generator[AudioChunk, None, None]:
        return self._stream("edit", {"text": text}, audio, request)

    def collect(
        self, capability: str, *arguments: object, request: EngineRequest | None = None
    ) -> AudioChunk | None:
        """The whole output on the output rank; None on the others."""
        header, audio = self._shared({"capability": capability}, arguments, request)
        inner = self._inner(header, request)
        result = self.model.collect(capability, *_inputs(capability, header, audio), request=inner)
        _write_back(request, inner)
        return result if self.output else None

    def prepare_voice(
        self, audio: AudioChunk, voice_dir: str | Path, request: EngineRequest | None = None
    ) -> dict[str, object] | None:
        """The output rank writes the voice into ``voice_dir``; the others into a folder of
        their own that is removed afterwards."""
        header, shared = self._shared({"capability": "prepare_voice"}, (audio,), request)
        inner = self._inner(header, request)
        assert shared is not None
        if self.output:
            result = self.model.prepare_voice(shared, voice_dir, inner)
        else:
            with tempfile.TemporaryDirectory(prefix="mizuoto-rank-") as scratch:
                self.model.prepare_voice(shared, Path(scratch) / "voice", inner)
            result = None
        _write_back(request, inner)
        return result

    def call(
        self,
        op: str,
        payload: Mapping[str, object] | None = None,
        request: EngineRequest | None = None,
    ) -> object:
        """The engine's call with the output rank's op and payload; None on the other ranks."""
        header, _ = self._shared(
            {"capability": "call", "op": op, "arguments": dict(payload or {})}, (), request
        )
        inner = self._inner(header, request)
        value = self.model.call(header["op"], header["arguments"], inner)
        _write_back(request, inner)
        return value if self.output else None

    def submit(
        self, capability: str, *arguments: object, request: EngineRequest | None = None
    ) -> Future[object]:
        """One call at a time, in order (every rank must submit the same calls)."""
        return self._submitter.submit(capability, *arguments, request=request)

    # -- in step with the other ranks --------------------------------------------------------

    def _stream(
        self,
        capability: str,
        fields: dict[str, Any],
        audio: AudioChunk | None,
        request: EngineRequest | None,
    ) -> Generator[AudioChunk, None, None]:
        arguments = (audio,) if audio is not None else ()
        header, shared = self._shared({"capability": capability, **fields}, arguments, request)
        inner = self._inner(header, request)
        chunks = getattr(self.model, capability)(*_inputs(capability, header, shared), inner)
        deadline = _deadline(request)
        with self._lock:
            self._active += 1
        try:
            while True:
                decision = self._lockstep.agree(_decision(request, deadline))
                if decision != GO:
                    break
                chunk = next(chunks, None)
                if chunk is None:
                    break
                if self.output:
                    yield chunk
        except GeneratorExit:  # the caller closed the stream early: the others stop here too
            if self.output:
                self._lockstep.agree(CLOSED)
            raise
        finally:
            chunks.close()
            _write_back(request, inner)
            with self._lock:
                self._active -= 1
        if decision == CANCELLED:
            raise CancelledError("cancelled between chunks", {"reason": "cancelled"})
        if decision == TIMED_OUT:
            timeout = request.timeout if request is not None else None
            raise OperationTimeoutError(
                f"ran past its timeout of {timeout} s", {"timeout": timeout}
            )

    def _shared(
        self,
        header: dict[str, Any],
        arguments: tuple[object, ...],
        request: EngineRequest | None,
    ) -> tuple[dict[str, Any], AudioChunk | None]:
        """The output rank's request, on every rank (checked there first, like any call)."""
        payload = b""
        for value in arguments:
            if value is not None and not isinstance(value, str):
                header["audio"], payload = audio_fields(value)  # type: ignore[arg-type]  # an AudioChunk
        header["params"] = dict(request.params) if request is not None else {}
        shared, raw = self._lockstep.share(header, payload)
        audio = audio_from_fields(shared["audio"], raw) if "audio" in shared else None
        return shared, audio

    @staticmethod
    def _inner(header: Mapping[str, Any], request: EngineRequest | None) -> EngineRequest:
        """The request this rank's host runs: rank 0's params; no timeout of its own (rank 0
        decides it between chunks) and the caller's progress."""
        return EngineRequest(
            params=dict(header.get("params") or {}),
            progress=request.progress if request is not None else None,
        )


def _inputs(capability: str, header: Mapping[str, Any], audio: AudioChunk | None) -> list[Any]:
    names = INPUTS.get(capability, ())
    return [audio if name == "audio" else header.get("text") for name in names]


def _deadline(request: EngineRequest | None) -> float | None:
    if request is None or request.timeout is None:
        return None
    return time.monotonic() + request.timeout


def _decision(request: EngineRequest | None, deadline: float | None) -> int:
    if request is not None and request.cancel_event.is_set():
        return CANCELLED
    if deadline is not None and time.monotonic() >= deadline:
        return TIMED_OUT
    return GO


def _write_back(request: EngineRequest | None, inner: EngineRequest) -> None:
    if request is not None:
        request.applied.update(inner.applied)
        request.warnings.extend(inner.warnings)
        request.timings.update(inner.timings)
