"""The OpenAI speech API over the server's engines: what the ``openai`` client, Open WebUI and
other OpenAI-speaking programs send, answered by the host's own synthesis.

``POST /v1/audio/speech`` takes OpenAI's body: ``model`` (an engine id, or ``ENGINE:MODEL``),
``input``, ``voice`` (``openai_voices``), ``response_format`` (``openai_audio``), ``speed``,
``stream_format`` (``audio``, or ``sse``: ``speech.audio.delta`` events of base64 audio, then
``speech.audio.done``), and, beside them, ``seed`` and any param the engine declares. ``speed``
sets the engine's declared ``speed`` param (a float, 1 the engine's own tempo); an engine without
one accepts only 1. ``GET /v1/models`` lists every synthesizing engine and ``ENGINE:MODEL``;
``GET /v1/audio/voices`` their voices (Kokoro-FastAPI's and LocalAI's shape, with the model).
Errors on these routes are OpenAI's ``{"error": {"message", "type", "param", "code"}}``, ``code``
the registry's, and say ``x-should-retry: false`` so that the client does not run a failed
synthesis three times. The Host, token and cross-site rules of ``access.py`` apply as they do to
every route (their refusals keep the native shape, whose ``code`` and ``message`` the client
reads alike).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from mizuoto_sdk.errors import InvalidRequest, Unsupported
from mizuoto_sdk.host import EngineRequest, RuntimeService
from mizuoto_sdk.server.answers import public_error
from mizuoto_sdk.server.openai_audio import MEDIA_TYPES, Encoder, available, encoder
from mizuoto_sdk.server.openai_voices import DEFAULT, voice_param, voices
from mizuoto_sdk.server.stream import ChunkFeed, Feeds, StreamCut, first_chunk

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from mizuoto_sdk.manifest import EngineManifest
    from mizuoto_sdk.types import AudioChunk

log = logging.getLogger(__name__)

SPEED_PARAM = "speed"
"""The declared param that OpenAI's ``speed`` sets: a ``float`` named ``speed``, 1 the engine's
own tempo (the sine engine's, for one)."""
_OPENAI_FIELDS = frozenset(
    {"model", "input", "voice", "response_format", "speed", "stream_format", "instructions"}
)
_ERROR_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 409: "conflict"}


@attrs.frozen
class Speech:
    """One checked ``/v1/audio/speech`` body."""

    engine: str
    model: str | None
    text: str
    params: dict[str, Any]
    format: str
    sse: bool


def openai_routes(
    service: RuntimeService, feeds: Feeds, voices_folder: Path, status: Mapping[str, int]
) -> APIRouter:
    """The routes, over ``service``; syntheses run as ``feeds``; ``status``: the HTTP status of
    each error code (the native routes' own)."""
    router = APIRouter(prefix="/v1", tags=["OpenAI speech"])

    def failed(error: BaseException) -> JSONResponse:
        shown = public_error(error)
        code = 404 if shown["code"] == "engine_not_found" else status.get(shown["code"], 500)
        field = shown["detail"].get("field")
        body = {
            "message": shown["message"],
            "type": _ERROR_TYPES.get(code, "server_error"),
            "param": field.removeprefix("params.") if isinstance(field, str) else None,
            "code": "model_not_found" if code == 404 else shown["code"],
        }
        return JSONResponse({"error": body}, code, headers={"x-should-retry": "false"})

    @router.post("/audio/speech")
    async def speech(request: Request) -> Response:
        """Audio of ``input`` in ``response_format``, streamed as it is made where it can be."""
        started = time.perf_counter()
        try:
            body = await _json_body(request)
            asked = await run_in_threadpool(_speech, service, voices_folder, body)
            model = await run_in_threadpool(service.load, asked.engine, asked.model)
            call = EngineRequest(params=asked.params)
            name = f"openai {model.name}"
            feed = feeds.start(
                f"openai-{id(call)}", lambda: model.synthesize(asked.text, call), call, name
            )
            chunk = await first_chunk(feed, request.receive)
            if chunk is None and not call.cancel_event.is_set():
                raise InvalidRequest(
                    f"input: engine {asked.engine!r} produced no audio for it", {"field": "input"}
                )
        except Exception as error:
            return failed(error)
        if chunk is None:  # the client left: nobody reads this answer
            return Response(status_code=status["cancelled"])
        headers = {
            "X-Mizuoto-Model": model.name,
            "X-Mizuoto-Sample-Rate": str(chunk.sample_rate),
            "X-Mizuoto-First-Chunk": f"{feed.first_chunk_seconds or 0.0:.6f}",
            "X-Mizuoto-First-Byte": f"{time.perf_counter() - started:.6f}",
            "Cache-Control": "no-store",
        }
        media = "text/event-stream" if asked.sse else MEDIA_TYPES[asked.format]
        return EncodedStream(feed, chunk, encoder(asked.format), asked.sse, media, headers)

    @router.get("/models")
    def models() -> JSONResponse:
        """Every synthesizing engine, and each of its models as ``ENGINE:MODEL``."""
        rows = []
        for manifest in _speakers(service):
            for name in [manifest.id, *(f"{manifest.id}:{m.id}" for m in manifest.models)]:
                rows.append({"id": name, "object": "model", "created": 0, "owned_by": "mizuoto"})
        return JSONResponse({"object": "list", "data": rows})

    @router.get("/audio/voices")
    def audio_voices(model: str | None = None) -> Response:
        """``{"voices": [{"id", "name", "model"}]}``, of every engine or of ``?model=``."""
        try:
            if model is None:
                chosen = _speakers(service)
            else:
                chosen = [_manifest(service, model.partition(":")[0], "model")]
        except Exception as error:
            return failed(error)
        rows = [
            {"id": voice, "name": voice, "model": manifest.id}
            for manifest in chosen
            for voice in voices(manifest, voices_folder)
        ]
        return JSONResponse({"voices": rows})

    return router


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except ValueError as error:
        raise InvalidRequest(f"body: not JSON ({error})", {"field": "body"}) from None
    if not isinstance(body, dict):
        raise InvalidRequest("body: expected a JSON object", {"field": "body"})
    return body


def _speakers(service: RuntimeService) -> list[EngineManifest]:
    records = service.discovery.records()
    found = [r.manifest for r in records if r.ok and r.manifest is not None]
    return [m for m in found if "synthesize" in m.capabilities]


def _manifest(service: RuntimeService, engine: str, field: str) -> EngineManifest:
    manifest = service.discovery.manifest(engine)  # engine_not_found names the known engines
    if "synthesize" not in manifest.capabilities:
        raise Unsupported(
            f"{field}: engine {engine!r} does not synthesize; it supports "
            f"{', '.join(manifest.capabilities)}",
            {"field": field, "capability": "synthesize"},
        )
    return manifest


def _text(body: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = body.get(key, default)
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"{key}: expected a non-empty string, got {value!r}", {"field": key})
    return value


def _speech(service: RuntimeService, folder: Path, body: Mapping[str, Any]) -> Speech:
    """The body checked against OpenAI's fields and the engine's manifest, before any load."""
    engine, _, model = _text(body, "model").partition(":")
    manifest = _manifest(service, engine, "model")
    manifest.model(model or None)
    text = _text(body, "input")
    voice = body.get("voice", DEFAULT)
    if isinstance(voice, dict) and isinstance(voice.get("id"), str):
        voice = voice["id"]
    if not isinstance(voice, str):
        raise InvalidRequest(f"voice: expected a voice name, got {voice!r}", {"field": "voice"})
    if body.get("instructions"):
        raise InvalidRequest(
            "instructions: this server's engines take no instructions; leave it out",
            {"field": "instructions"},
        )
    stream_format = body.get("stream_format", "audio")
    if stream_format not in ("audio", "sse"):
        raise InvalidRequest(
            f"stream_format: expected 'audio' or 'sse', got {stream_format!r}",
            {"field": "stream_format"},
        )
    params = {k: v for k, v in body.items() if k not in _OPENAI_FIELDS}
    declared = {p.name for p in manifest.params}
    unknown = sorted(set(params) - declared - {"seed"})
    if unknown and manifest.params:
        raise InvalidRequest(
            f"{unknown[0]}: not a field of OpenAI's speech body nor a param of engine "
            f"{engine!r}; its params: {', '.join(sorted(declared | {'seed'}))}",
            {"field": unknown[0]},
        )
    chosen = voice_param(manifest, folder, voice, "voice")
    if chosen is not None:
        params["voice"] = chosen
    _speed(body.get("speed"), declared, engine, params)
    manifest.check_params(params)
    return Speech(engine, model or None, text, params, _format(body), stream_format == "sse")


def _speed(speed: object, declared: set[str], engine: str, params: dict[str, Any]) -> None:
    if speed is None:
        return
    if isinstance(speed, bool) or not isinstance(speed, (int, float)):
        raise InvalidRequest(f"speed: expected a number, got {speed!r}", {"field": "speed"})
    if SPEED_PARAM in declared:
        params[SPEED_PARAM] = float(speed)
    elif speed != 1:
        raise InvalidRequest(
            f"speed: engine {engine!r} declares no speed param; leave speed out or at 1",
            {"field": "speed"},
        )


def _format(body: Mapping[str, Any]) -> str:
    name = body.get("response_format", "mp3")
    reasons = available()
    if name not in reasons:
        reason = "OpenAI defines no such format"
    elif reasons[name] is not None:
        reason = str(reasons[name])
    else:
        return str(name)
    usable = ", ".join(n for n, why in reasons.items() if why is None)
    raise InvalidRequest(
        f"response_format: {name!r} is not available ({reason}); this server writes {usable}",
        {"field": "response_format", "available": usable.split(", ")},
    )


class EncodedStream(Response):
    """The answer, sent as the feed makes it: raw bytes, or each piece as an SSE delta event."""

    def __init__(
        self,
        feed: ChunkFeed,
        first: AudioChunk,
        encoding: Encoder,
        sse: bool,
        media_type: str,
        headers: Mapping[str, str],
    ) -> None:
        self.status_code = 200
        self.background = None
        self.media_type = media_type
        self.init_headers(dict(headers))  # no content-length: the length is not known
        self.feed, self.first, self.encoding, self.sse = feed, first, encoding, sse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        left = asyncio.create_task(_disconnected(receive))
        sender = asyncio.create_task(self._send_all(send))
        try:
            await asyncio.wait({left, sender}, return_when=asyncio.FIRST_COMPLETED)
            if left.done() and not sender.done():
                log.info("client went away after %d chunks: request cancelled", self.feed.sent)
                self.feed.cancel()
                sender.cancel()
            await asyncio.gather(sender, return_exceptions=left.done())
        finally:
            self.feed.cancel()  # a no-op after a whole stream; stops the engine otherwise
            left.cancel()
            sender.cancel()

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})

        async def piece(data: bytes) -> None:
            if data and self.sse:
                event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
                data = f"data: {json.dumps(event)}\n\n".encode()
            if data:
                await send({"type": "http.response.body", "body": data, "more_body": True})

        chunk: AudioChunk | None = self.first
        await piece(self.encoding.begin(self.first.sample_rate))
        while chunk is not None:
            await piece(self.encoding.add(chunk.samples))
            try:
                chunk = await self.feed.next()
            except Exception as error:
                await self._cut(send, error)
                return
        await piece(self.encoding.finish())
        if self.sse:  # Mizuoto counts no tokens
            usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
            done = {"type": "speech.audio.done", "usage": usage}
            await send(
                {
                    "type": "http.response.body",
                    "body": f"data: {json.dumps(done)}\n\n".encode(),
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _cut(self, send: Send, error: Exception) -> None:
        """A failure after the answer began: SSE says so in an ``error`` event and ends; raw
        audio ends without its last chunk, which is how a client learns it is incomplete."""
        shown = public_error(error)
        log.warning(
            "synthesis failed after %d chunks [%s]: %s", self.feed.sent, shown["code"], error
        )
        if not self.sse:
            raise StreamCut(f"[{shown['code']}] {error}") from error
        event = {
            "type": "error",
            "error": {
                "message": shown["message"],
                "type": "server_error",
                "param": None,
                "code": shown["code"],
            },
        }
        await send(
            {
                "type": "http.response.body",
                "body": f"data: {json.dumps(event)}\n\n".encode(),
                "more_body": False,
            }
        )


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
