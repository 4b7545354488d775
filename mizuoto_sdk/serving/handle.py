"""The handle of a model served by worker processes: it answers like a model in this process.

``ReplicatedModel`` has the calls of ``mizuoto_sdk.host.LocalModel`` (lazy streams, collect,
prepare_voice, call, submit) and routes each request whole to one healthy replica. Requests are
checked here before any replica sees them (capability, inputs, params), so a bad request is the
caller's error whatever the deployment, and never costs a replica.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from mizuoto_sdk.errors import EngineError, EngineUnavailable, InvalidRequest, Unsupported
from mizuoto_sdk.frames import Frame, audio_fields, chunk_from_frame
from mizuoto_sdk.request import EngineRequest
from mizuoto_sdk.serving import exchange
from mizuoto_sdk.serving.inputs import checked_audio, checked_text, collected_inputs
from mizuoto_sdk.serving.routing import ReplicaStatus, Router
from mizuoto_sdk.serving.submit import Submitter
from mizuoto_sdk.types import AudioChunk

if TYPE_CHECKING:
    from mizuoto_sdk.manifest import EngineManifest
    from mizuoto_sdk.serving.exchange import Replica


T = TypeVar("T")


class ReplicatedModel:
    """A model whose replicas run in worker processes (``mode == "local"``).

    Startup is lazy: the first request starts every replica, unless ``start()`` did. A stream
    stays on the replica that took it. ``close()`` is idempotent: queued submissions are
    cancelled, in-flight requests fail with ``engine_unavailable`` and no worker is left.
    ``retire()`` closes it gently: requests begun (a stream from its first chunk) and
    submissions made finish first.
    """

    mode = "local"

    def __init__(self, name: str, manifest: EngineManifest, replicas: Sequence[Replica]) -> None:
        self.name = name
        self.manifest = manifest
        self._replicas = tuple(replicas)
        self._router = Router(self._replicas, manifest.id)
        self._submitter = Submitter(self, workers=4 * len(self._replicas), name=name)
        self._start_lock = threading.Lock()
        self._started = False
        self._close_lock = threading.Lock()
        self.closed = False
        # Requests begun and submissions not done; retired: take no new ones, close at none.
        self._drain = threading.Condition()
        self._begun = 0
        self._submitted: dict[int, int] = {}  # id(request) of each submission not done: count
        self.retired = False

    @property
    def replicas(self) -> tuple[ReplicaStatus, ...]:
        return tuple(replica.status() for replica in self._replicas)

    @property
    def busy(self) -> bool:
        return any(replica.in_flight for replica in self._replicas)

    @property
    def dtype(self) -> str | None:
        """The dtype the workers loaded the model in (None until one has started)."""
        for replica in self._replicas:
            if replica.metadata:
                return str(replica.metadata.get("dtype"))
        return None

    @property
    def description(self) -> dict[str, object]:
        """What the first ready replica's worker said of its model when it started."""
        for replica in self._replicas:
            if replica.metadata:
                return dict(replica.metadata.get("description") or {})
        return {}

    def start(self) -> ReplicatedModel:
        """Start every replica now (they start on the first request otherwise); a replica that
        fails to start fails the whole deployment, which then leaves no process behind."""
        with self._start_lock:
            if self.closed:
                raise self._closed()
            if self._started:
                return self
            errors: list[BaseException] = []
            threads = [
                threading.Thread(target=_start, args=(replica, errors), daemon=True)
                for replica in self._replicas
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if errors:
                self.close()
                raise errors[0]
            self._started = True
            return self

    def close(self) -> None:
        """Stop every replica, all at once (each within its bounded stop); a second close
        returns once the first has stopped them."""
        with self._close_lock:
            if self.closed:
                return
            self.closed = True
            self._submitter.close()
            closers = [
                threading.Thread(
                    target=replica.close, name=f"mizuoto-close-{replica.id}", daemon=True
                )
                for replica in self._replicas
            ]
            for closer in closers:
                closer.start()
            for closer in closers:
                closer.join()
        with self._drain:
            self._drain.notify_all()

    def retire(self) -> None:
        """Take no new request, and close once the requests begun and the submissions made
        have ended (at once if there are none): what its settings changed for is served by a
        new model, while what is running finishes as it began. Idempotent."""
        with self._drain:
            self.retired = True
            idle = self._idle()
        if idle:
            self.close()

    def _idle(self) -> bool:
        return not self._begun and not self._submitted and not self.busy

    def _begin(self, request: EngineRequest) -> None:
        """Count a request that begins now; a retired model takes only submissions made before."""
        with self._drain:
            if self.retired and id(request) not in self._submitted:
                raise self._closed()
            self._begun += 1

    def _end(self) -> None:
        with self._drain:
            self._begun -= 1
            idle = self.retired and self._idle()
        if idle:
            _close_later(self)

    def __enter__(self) -> ReplicatedModel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the calls ---------------------------------------------------------------------------

    def synthesize(
        self, text: str, request: EngineRequest | None = None
    ) -> Generator[AudioChunk, None, None]:
        """A lazy stream of float32 mono chunks; close it to stop the engine early."""
        self._supports("synthesize")
        return self._stream({"capability": "synthesize", "text": self._text(text)}, b"", request)

    def convert(
        self, audio: AudioChunk, request: EngineRequest | None = None
    ) -> Generator[AudioChunk, None, None]:
        self._supports("convert")
        fields, payload = self._audio(audio)
        return self._stream({"capability": "convert", "audio": fields}, payload, request)

    def edit(
        self, audio: AudioChunk, text: str, request: EngineRequest | None = None
    ) -> Generator[AudioChunk, None, None]:
        self._supports("edit")
        fields, payload = self._audio(audio)
        header: dict[str, object] = {
            "capability": "edit",
            "audio": fields,
            "text": self._text(text),
        }
        return self._stream(header, payload, request)

    def collect(
        self, capability: str, *arguments: object, request: EngineRequest | None = None
    ) -> AudioChunk:
        """The whole output of a streaming capability as one float32 mono chunk."""
        inputs = self._checked(collected_inputs, capability, arguments)
        self._supports(capability)
        header: dict[str, object] = {"capability": "collect", "of": capability}
        payload = b""
        audio = inputs.get("audio")
        if isinstance(audio, AudioChunk):
            header["audio"], payload = audio_fields(audio)
        if "text" in inputs:
            header["text"] = inputs["text"]
        return chunk_from_frame(self._run(header, payload, request))

    def prepare_voice(
        self, audio: AudioChunk, voice_dir: str | Path, request: EngineRequest | None = None
    ) -> dict[str, object]:
        """Let the engine write a voice into ``voice_dir`` (a folder this machine's workers
        share with the caller), which appears only if it succeeds."""
        self._supports("prepare_voice")
        fields, payload = self._audio(audio)
        if not isinstance(voice_dir, str | os.PathLike):
            raise self._invalid("voice_dir", f"expected a folder path, got {voice_dir!r}")
        header: dict[str, object] = {
            "capability": "prepare_voice",
            "audio": fields,
            "voice_dir": os.path.abspath(os.fspath(voice_dir)),
        }
        value = self._run(header, payload, request).header.get("value")
        return dict(value) if isinstance(value, dict) else {}

    def call(
        self,
        op: str,
        payload: Mapping[str, object] | None = None,
        request: EngineRequest | None = None,
    ) -> object:
        """The engine's ``call``; payload and result cross the process boundary as JSON."""
        self._supports("call")
        if not isinstance(op, str) or not op:
            raise self._invalid("op", f"expected an operation name, got {op!r}")
        try:
            arguments = json.loads(json.dumps(dict(payload or {})))
        except (TypeError, ValueError) as error:
            raise self._invalid(
                "payload", f"a worker process takes JSON values only: {error}"
            ) from None
        header: dict[str, object] = {"capability": "call", "op": op, "arguments": arguments}
        return self._run(header, b"", request).header.get("value")

    def submit(
        self, capability: str, *arguments: object, request: EngineRequest | None = None
    ) -> Future[object]:
        """Run a call on a thread of the handle; a stream's future resolves to its chunks."""
        request = request if request is not None else EngineRequest()
        key = id(request)
        with self._drain:
            if self.retired:
                raise self._closed()
            self._submitted[key] = self._submitted.get(key, 0) + 1
        try:
            future = self._submitter.submit(capability, *arguments, request=request)
        except BaseException:
            self._submission_done(key)
            raise
        future.add_done_callback(lambda _: self._submission_done(key))
        return future

    def _submission_done(self, key: int) -> None:
        with self._drain:
            left = self._submitted.pop(key) - 1
            if left:
                self._submitted[key] = left
            idle = self.retired and self._idle()
        if idle:
            _close_later(self)

    # -- routing -----------------------------------------------------------------------------

    def _stream(
        self, header: dict[str, object], payload: bytes, request: EngineRequest | None
    ) -> Generator[AudioChunk, None, None]:
        request = self._request(request, header)
        # A generator: routing happens at the first next(), like the engine's own first step.
        self._begin(request)
        try:
            replica = self._route()
            yield from exchange.stream(replica, header, payload, request)
        finally:
            self._end()

    def _run(
        self, header: dict[str, object], payload: bytes, request: EngineRequest | None
    ) -> Frame:
        request = self._request(request, header)
        self._begin(request)
        try:
            return exchange.run(self._route(), header, payload, request)
        finally:
            self._end()

    def _route(self) -> Replica:
        if self.closed:
            raise self._closed()
        self.start()
        return self._replicas[self._router.pick()]

    def _request(self, request: EngineRequest | None, header: dict[str, object]) -> EngineRequest:
        request = request if request is not None else EngineRequest()
        try:  # before any replica sees it: a bad param is the caller's mistake
            self.manifest.check_params(request.params)
        except EngineError as error:
            error.detail.setdefault("engine", self.manifest.id)
            raise
        header["params"] = request.params
        header["timeout"] = request.timeout
        return request

    # -- checks ------------------------------------------------------------------------------

    def _supports(self, capability: str) -> None:
        if capability not in self.manifest.capabilities:
            raise Unsupported(
                f"engine {self.manifest.id!r} does not support {capability}; it supports "
                f"{', '.join(self.manifest.capabilities)}",
                {"capability": capability, "engine": self.manifest.id},
            )

    def _invalid(self, field: str, message: str) -> InvalidRequest:
        return InvalidRequest(f"{field}: {message}", {"field": field, "engine": self.manifest.id})

    def _text(self, text: object) -> str:
        return self._checked(checked_text, text)

    def _audio(self, audio: object) -> tuple[dict[str, object], bytes]:
        return audio_fields(self._checked(checked_audio, audio))

    def _checked(self, check: Callable[..., T], *arguments: object) -> T:
        """``check(*arguments)``, its InvalidRequest naming this engine too."""
        try:
            return check(*arguments)
        except InvalidRequest as error:
            error.detail["engine"] = self.manifest.id
            raise

    def _closed(self) -> EngineUnavailable:
        if self.retired and not self.closed:
            return EngineUnavailable(
                f"{self.name}: its settings changed; load it again for a model that has them",
                {"engine": self.manifest.id, "reason": "closed"},
            )
        return EngineUnavailable(
            f"{self.name} was closed; load it again",
            {"engine": self.manifest.id, "reason": "closed"},
        )


def _close_later(model: ReplicatedModel) -> None:
    """Close a retired model off the thread of the request that ended last, which a close
    (waiting for its workers to exit) must not hold up."""
    threading.Thread(target=model.close, name=f"mizuoto-retire-{model.name}", daemon=True).start()


def _start(replica: Replica, errors: list[BaseException]) -> None:
    try:
        replica.start()
    except BaseException as error:
        errors.append(error)
