"""Audio in, audio out: ``POST /api/v1/convert`` and ``POST /api/v1/edit``, and the streamed
answer they share with ``POST /api/v1/synthesize``.

An upload is ``multipart/form-data`` with two parts: ``audio``, a WAV file, and ``request``, JSON
``{"engine", "model"?, "params"?, "seed"?, "device"?}`` (an edit adds ``"text"``, the words the
engine's ``edit`` takes beside the audio). The body is read as it comes and refused past
``MAX_UPLOAD`` bytes, the limit of a voice recording; it is parsed with the standard library's
MIME parser. The answer streams like a synthesis: 16-bit PCM mono WAV as the engine's chunks
come, with the ``X-Mizuoto-Request`` id that ``GET /api/v1/requests/{id}`` answers for.

A form on any web page can send ``multipart/form-data``, so ``access.py`` lets such a body
through only with an ``Authorization`` or ``X-Mizuoto-Client`` header, which no form sets.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from email import policy
from email.message import MIMEPart
from email.parser import BytesParser
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from mizuoto_sdk.audio import parse_wav
from mizuoto_sdk.errors import InvalidRequest, Unsupported
from mizuoto_sdk.host import EngineRequest, RuntimeService
from mizuoto_sdk.server.answers import public_error
from mizuoto_sdk.server.limits import REQUEST_TIMEOUT
from mizuoto_sdk.server.outcomes import Outcomes
from mizuoto_sdk.server.stream import Feeds, WavStream, first_chunk
from mizuoto_sdk.types import AudioChunk

API = "/api/v1"
MAX_UPLOAD = 64 * 2**20
"""The largest body ``POST /api/v1/convert`` and ``/edit`` take, the audio and its request."""
CANCELLED = 499  # the client closed the request (it rarely sees this answer)
WAV_TYPES = frozenset({"audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave"})
_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "16-bit PCM mono WAV, sent as it is made (sizes 0xFFFFFFFF: unknown)",
        "content": {"audio/wav": {}},
    }
}
_FORM: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["audio", "request"],
                    "properties": {
                        "audio": {"type": "string", "format": "binary"},
                        "request": {"type": "string", "description": "the request, JSON"},
                    },
                }
            }
        },
    }
}


class ConvertRequest(BaseModel):
    """The ``request`` part of a convert upload."""

    model_config = ConfigDict(extra="forbid")

    engine: str = Field(description="an engine id with the convert capability")
    params: dict[str, Any] = Field(default_factory=dict, description="the engine's params")
    seed: int | None = Field(default=None, ge=0, description="the same seed, the same audio")
    model: str | None = Field(default=None, description="a model id; default: the engine's")
    device: str | None = Field(default=None, description="default: the engine's device setting")


class EditRequest(ConvertRequest):
    """The ``request`` part of an edit upload: the words beside the audio."""

    text: str = Field(description="the words the edit takes (what the audio should say)")


def upload_routes(
    service: RuntimeService, feeds: Feeds, outcomes: Outcomes, open_for_work: Callable[[], None]
) -> APIRouter:
    """The convert and edit routes over ``service``, recorded in ``outcomes``."""
    router = APIRouter()

    @router.post(f"{API}/convert", responses=_RESPONSE, openapi_extra=_FORM)
    async def convert(request: Request) -> Response:
        """The engine's ``convert`` of the ``audio`` part, streamed as it is made."""
        open_for_work()
        audio, body = await _upload(request, ConvertRequest)
        return await stream_audio(
            request,
            feeds,
            outcomes,
            body.engine,
            lambda: _load(service, "convert", body),
            lambda model, call: model.convert(audio, call),
            "audio",
        )

    @router.post(f"{API}/edit", responses=_RESPONSE, openapi_extra=_FORM)
    async def edit(request: Request) -> Response:
        """The engine's ``edit`` of the ``audio`` part with ``request.text``, streamed."""
        open_for_work()
        audio, body = await _upload(request, EditRequest)
        assert isinstance(body, EditRequest)
        if not body.text.strip():
            raise InvalidRequest("request.text: is empty", {"field": "request.text"})
        return await stream_audio(
            request,
            feeds,
            outcomes,
            body.engine,
            lambda: _load(service, "edit", body),
            lambda model, call: model.edit(audio, body.text, call),
            "audio",
        )

    return router


async def stream_audio(
    request: Request,
    feeds: Feeds,
    outcomes: Outcomes,
    engine: str,
    load: Callable[[], tuple[Any, EngineRequest]],
    produce: Callable[[Any, EngineRequest], Iterable[AudioChunk]],
    field: str,
) -> Response:
    """Audio as it is made: ``load()`` (in a worker thread) gives the model and the request,
    ``produce(model, request)`` the chunks; a client that leaves cancels the call. ``field``
    is named when the engine makes no audio at all."""
    started = time.perf_counter()
    request_id = outcomes.begin(engine)
    try:
        model, call = await run_in_threadpool(load)
        outcomes.end(request_id, "streaming", model=model.name)
        name = f"{request.url.path.rsplit('/', 1)[-1]} {model.name}"
        feed = feeds.start(request_id, lambda: produce(model, call), call, name)
        chunk = await first_chunk(feed, request.receive)
        if chunk is None and not call.cancel_event.is_set():
            raise InvalidRequest(
                f"{field}: engine {engine!r} produced no audio for it", {"field": field}
            )
    except Exception as error:
        outcomes.end(request_id, "failed", error=public_error(error))
        raise
    if chunk is None:  # the client left: nobody reads this answer
        outcomes.end(request_id, "cancelled")
        return Response(status_code=CANCELLED)

    def ended(state: str, chunks: int, error: BaseException | None) -> None:
        failure = None if error is None else public_error(error)
        outcomes.end(request_id, state, chunks=chunks, error=failure)

    headers = {
        "X-Mizuoto-Request": request_id,
        "X-Mizuoto-Model": model.name,
        "X-Mizuoto-Sample-Rate": str(chunk.sample_rate),
        "X-Mizuoto-First-Chunk": f"{feed.first_chunk_seconds or 0.0:.6f}",
        "X-Mizuoto-First-Byte": f"{time.perf_counter() - started:.6f}",
        "Cache-Control": "no-store",
    }
    return WavStream(feed, chunk, headers, ended)


def check_request(
    service: RuntimeService,
    engine: str,
    capability: str,
    params: dict[str, Any],
    model: str | None,
) -> None:
    """Refuse a request the engine would refuse, before its model loads: a refused request must
    cost no memory and no loading time (the host checks the same again when the call begins)."""
    manifest = service.discovery.manifest(engine)
    if capability not in manifest.capabilities:
        raise Unsupported(
            f"engine {engine!r} does not support {capability}; it supports "
            f"{', '.join(manifest.capabilities)}",
            {"capability": capability},
        )
    manifest.model(model)
    manifest.check_params(params)


def with_seed(params: dict[str, Any], seed: int | None, field: str = "seed") -> dict[str, Any]:
    """``params`` with ``seed`` in it; refused when both set one."""
    params = dict(params)
    if seed is not None:
        if "seed" in params:
            raise InvalidRequest(
                f"{field} and params.seed both set the seed; give one of them", {"field": field}
            )
        params["seed"] = seed
    return params


async def read_body(request: Request, limit: int, types: frozenset[str], what: str) -> bytes:
    """The request's body, refused unless typed as one of ``types`` (415), as soon as it passes
    ``limit`` bytes (400 naming ``audio``), or when ``REQUEST_TIMEOUT`` seconds pass without a
    byte of it (408). ``what`` names the body in errors."""
    given = request.headers.get("content-type", "")
    if given.partition(";")[0].strip().lower() not in types:
        raise HTTPException(
            415,
            f"content-type: {what} is sent as {' or '.join(sorted(types))}, not "
            f"{given or 'untyped'}",
        )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_long(what, limit)
    received = bytearray()
    parts = request.stream().__aiter__()
    while True:
        try:
            part = await asyncio.wait_for(parts.__anext__(), REQUEST_TIMEOUT)
        except StopAsyncIteration:
            return bytes(received)
        except asyncio.TimeoutError:
            raise HTTPException(
                408, f"{what} stopped coming: nothing of it for {REQUEST_TIMEOUT:g} s"
            ) from None
        received += part
        if len(received) > limit:
            raise _too_long(what, limit)


def _too_long(what: str, limit: int) -> InvalidRequest:
    return InvalidRequest(
        f"audio: {what} is longer than {limit // 2**20} MiB; send a shorter one",
        {"field": "audio", "limit_bytes": limit},
    )


async def _upload(
    request: Request, kind: type[ConvertRequest]
) -> tuple[AudioChunk, ConvertRequest]:
    """The audio and the request of a multipart upload, checked."""
    body = await read_body(
        request, MAX_UPLOAD, frozenset({"multipart/form-data"}), "the upload (audio and request)"
    )
    parts = _parts(request.headers.get("content-type", ""), body)
    for name in ("audio", "request"):
        if name not in parts:
            raise InvalidRequest(
                f"{name}: the upload has no {name!r} part; send the WAV file as 'audio' and the "
                "JSON request as 'request'",
                {"field": name, "parts": sorted(parts)},
            )
    audio = parts["audio"].get_payload(decode=True)
    if not isinstance(audio, bytes) or audio[:4] != b"RIFF" or audio[8:12] != b"WAVE":
        raise HTTPException(415, "audio: the file is not a WAV file (no RIFF/WAVE header)")
    raw = parts["request"].get_payload(decode=True)
    try:
        document = json.loads(raw if isinstance(raw, bytes) else b"")
    except ValueError as error:
        raise InvalidRequest(f"request: is not JSON ({error})", {"field": "request"}) from None
    try:
        checked = kind.model_validate(document)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(["request", *map(str, first["loc"])])
        raise InvalidRequest(f"{field}: {first['msg']}", {"field": field}) from None
    return parse_wav(audio, "audio", "the uploaded file"), checked


def _parts(content_type: str, body: bytes) -> dict[str, MIMEPart]:
    """The named parts of a ``multipart/form-data`` body (the last of each name)."""
    head = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1", "replace")
    message = BytesParser(policy=policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise InvalidRequest(
            "content-type: the body is not multipart (a boundary is missing or wrong)",
            {"field": "content-type"},
        )
    found: dict[str, MIMEPart] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            found[name] = part
    return found


def _load(
    service: RuntimeService, capability: str, body: ConvertRequest
) -> tuple[Any, EngineRequest]:
    """The model and the request of an upload, loaded and checked before the answer begins."""
    params = with_seed(body.params, body.seed, "request.seed")
    check_request(service, body.engine, capability, params, body.model)
    model = service.load(body.engine, body.model, device=body.device)
    return model, EngineRequest(params=params)
