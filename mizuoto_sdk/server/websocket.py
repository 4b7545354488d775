"""Text streamed in, audio streamed out: ``WebSocket /api/v1/synthesize/stream``, for a voice agent
whose language model writes the text while it is spoken.

The client sends JSON: first ``{"engine", "model"?, "params"?}``, then ``{"text": "..."}`` pieces,
then ``{"end": true}``. The server answers one JSON ``{"sample_rate", "request"}`` before the
first audio, then binary frames of 16-bit little-endian mono PCM as the engine's chunks come, and
a last ``{"done": true}``, or ``{"error": {"code", "message", "detail"}}`` and the close.

An engine that declares ``text_input=True`` gets the pieces as they come, on one call's
``EngineRequest.text_input`` (started once there is some text), and cuts them itself. Other
engines read their text whole, so the text is cut into sentences as it comes
(``split_sentences``: a sentence is finished once text after it has begun) and each finished
sentence is synthesized while the rest arrives, one after the other, with the same params; the
audio of each sentence is the host's synthesis of that sentence. Closing the socket cancels the
call that runs. ``access.py`` has checked the handshake (the Host header on loopback, the token,
another site's ``Origin``) before the route sees it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import secrets
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from starlette.concurrency import run_in_threadpool

from mizuoto_runtime.text import split_sentences
from mizuoto_sdk.audio import pcm16
from mizuoto_sdk.errors import InvalidRequest, Unsupported
from mizuoto_sdk.host import EngineRequest, RuntimeService
from mizuoto_sdk.server.answers import public_error
from mizuoto_sdk.server.stream import Feeds

log = logging.getLogger(__name__)

PATH = "/api/v1/synthesize/stream"
_END = None
_T = TypeVar("_T")


def websocket_routes(service: RuntimeService, feeds: Feeds) -> APIRouter:
    """The route over ``service`` (``access.Access`` checks who may open it)."""
    router = APIRouter()

    @router.websocket(PATH)
    async def synthesize_stream(socket: WebSocket) -> None:
        await socket.accept()
        sentences: asyncio.Queue[str | None] = asyncio.Queue()
        calls: list[EngineRequest] = []
        try:
            opening = await socket.receive_json()
            engine, model_id, params = _opening(opening)
            streamed = await run_in_threadpool(_check, service, engine, model_id, params)
            model = await run_in_threadpool(service.load, engine, model_id)
        except WebSocketDisconnect:
            return
        except Exception as error:
            await _fail(socket, error)
            return
        reader = asyncio.create_task(_read_text(socket, sentences, split=not streamed))
        speak = _speak_streamed if streamed else _speak
        try:
            await speak(socket, feeds, model, params, sentences, calls, reader)
        except WebSocketDisconnect:
            log.info("WebSocket client left: its call is cancelled")
        except Exception as error:
            await _fail(socket, error)
        finally:
            reader.cancel()
            for call in calls:
                call.cancel()

    return router


async def _read_text(
    socket: WebSocket, sentences: asyncio.Queue[str | None], split: bool = True
) -> None:
    """Queue each finished sentence as the text comes (each piece as it is, unless ``split``),
    the rest at ``end``, then the end; then wait for the client to leave, which ends the reader
    with WebSocketDisconnect."""
    text = ""
    while True:
        message = await socket.receive_json()
        if not isinstance(message, dict) or not (
            isinstance(message.get("text"), str) or message.get("end") is True
        ):
            raise InvalidRequest(
                'expected {"text": "..."} or {"end": true} after the first message',
                {"field": "message"},
            )
        text += message.get("text", "")
        if not split and text:
            await sentences.put(text)
            text = ""
        if message.get("end") is True:
            if text.strip():
                await sentences.put(text)
            await sentences.put(_END)
            break
        *finished, text = split_sentences(text) or [""]
        for sentence in finished:
            await sentences.put(sentence)
    while (await socket.receive())["type"] != "websocket.disconnect":
        pass  # the text has ended: only the client's leaving matters now
    raise WebSocketDisconnect(1000)


async def _speak(
    socket: WebSocket,
    feeds: Feeds,
    model: Any,
    params: dict[str, Any],
    sentences: asyncio.Queue[str | None],
    calls: list[EngineRequest],
    reader: asyncio.Task[None],
) -> None:
    request_id = secrets.token_hex(8)
    rate = 0
    while True:
        sentence = await _unless_left(sentences.get(), reader)
        if sentence is _END:
            await socket.send_json({"done": True})
            await socket.close()
            return
        call = EngineRequest(params=dict(params))
        calls.append(call)
        name = f"websocket {request_id}"
        feed = feeds.start(
            f"ws-{request_id}-{len(calls)}", _start(model, sentence, call), call, name
        )
        try:
            rate = await _send_audio(socket, feed, reader, request_id, rate)
        finally:
            feed.cancel()  # a no-op once the sentence is whole


async def _speak_streamed(
    socket: WebSocket,
    feeds: Feeds,
    model: Any,
    params: dict[str, Any],
    pieces: asyncio.Queue[str | None],
    calls: list[EngineRequest],
    reader: asyncio.Task[None],
) -> None:
    """One call for the whole text: it starts with the first piece that has a word (the host
    wants some text to start from), the rest follow on its ``text_input``."""
    request_id = secrets.token_hex(8)
    start = ""
    while not start.strip():
        piece = await _unless_left(pieces.get(), reader)
        if piece is _END:
            await socket.send_json({"done": True})
            await socket.close()
            return
        start += piece
    text_input: queue.Queue[str | None] = queue.Queue()
    call = EngineRequest(params=dict(params), text_input=text_input)
    calls.append(call)
    pump = asyncio.create_task(_pump(pieces, text_input))
    feed = feeds.start(
        f"ws-{request_id}", _start(model, start, call), call, f"websocket {request_id}"
    )
    try:
        await _send_audio(socket, feed, reader, request_id, 0)
    finally:
        feed.cancel()  # a no-op once the text is spoken
        pump.cancel()
    await socket.send_json({"done": True})
    await socket.close()


async def _pump(pieces: asyncio.Queue[str | None], text_input: queue.Queue[str | None]) -> None:
    while (piece := await pieces.get()) is not _END:
        text_input.put(piece)
    text_input.put(_END)


async def _send_audio(
    socket: WebSocket, feed: Any, reader: asyncio.Task[None], request_id: str, rate: int
) -> int:
    """Send the feed's chunks as PCM, after the opening JSON when ``rate`` is still 0; the rate."""
    while (chunk := await _unless_left(feed.next(), reader)) is not None:
        if rate == 0:
            rate = chunk.sample_rate
            await socket.send_json({"sample_rate": rate, "request": request_id})
        await socket.send_bytes(pcm16(chunk.samples))
    return rate


def _start(model: Any, text: str, call: EngineRequest) -> Any:
    return lambda: model.synthesize(text, call)


async def _unless_left(awaited: Awaitable[_T], reader: asyncio.Task[None]) -> _T:
    """What ``awaited`` gives, unless the reader fails first (the client left, or sent
    nonsense): then its error is raised, and ``awaited`` cancelled."""
    task = asyncio.ensure_future(awaited)
    await asyncio.wait({task, reader}, return_when=asyncio.FIRST_COMPLETED)
    if not task.done() and reader.done() and reader.exception() is not None:
        task.cancel()
        raise reader.exception()  # type: ignore[misc]
    return await task  # the text may have ended: what was asked for goes on


def _opening(message: object) -> tuple[str, str | None, dict[str, Any]]:
    if not isinstance(message, dict) or not isinstance(message.get("engine"), str):
        raise InvalidRequest(
            'the first message: expected {"engine": ID, "model"?, "params"?}', {"field": "engine"}
        )
    unknown = sorted(set(message) - {"engine", "model", "params"})
    if unknown:
        raise InvalidRequest(
            f"{unknown[0]}: not a field of the first message (engine, model, params)",
            {"field": unknown[0]},
        )
    model, params = message.get("model"), message.get("params") or {}
    if model is not None and not isinstance(model, str):
        raise InvalidRequest(f"model: expected a model id, got {model!r}", {"field": "model"})
    if not isinstance(params, dict):
        raise InvalidRequest(f"params: expected an object, got {params!r}", {"field": "params"})
    return message["engine"], model, params


def _check(service: RuntimeService, engine: str, model: str | None, params: dict[str, Any]) -> bool:
    """Refuse what the engine cannot take; whether it reads text streamed in (``text_input``)."""
    manifest = service.discovery.manifest(engine)
    if "synthesize" not in manifest.capabilities:
        raise Unsupported(
            f"engine {engine!r} does not support synthesize; it supports "
            f"{', '.join(manifest.capabilities)}",
            {"capability": "synthesize"},
        )
    manifest.model(model)
    manifest.check_params(params)
    return manifest.text_input


async def _fail(socket: WebSocket, error: BaseException) -> None:
    shown = public_error(error)
    log.info("WebSocket synthesis failed [%s]: %s", shown["code"], shown["message"])
    try:
        await socket.send_json({"error": shown})
        await socket.close()
    except Exception:  # the client is gone already
        pass
