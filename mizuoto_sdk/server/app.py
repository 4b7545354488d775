"""The HTTP API and the web page over one RuntimeService (FastAPI; ``mizuoto serve`` runs it).

Every handler that touches the service runs in a worker thread (plain ``def`` handlers, or
``run_in_threadpool``), never on the event loop; a synthesis runs on a thread of its own
(``stream.ChunkFeed``). Errors are ``{"code", "message", "detail"}`` (``answers.py``) with the
registry's codes mapped to HTTP statuses (``STATUS``); ``access.py`` checks the Host header, the
token and where a request that changes something comes from first, ``limits.py`` the size of a
JSON body.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from mizuoto_sdk.audio import parse_wav
from mizuoto_sdk.errors import EngineError, EngineUnavailable, InvalidRequest
from mizuoto_sdk.host import EngineRequest, RuntimeService
from mizuoto_sdk.server.access import Access
from mizuoto_sdk.server.answers import answer_class, jsonable, public_error
from mizuoto_sdk.server.limits import BodyLimit
from mizuoto_sdk.server.openai_api import openai_routes
from mizuoto_sdk.server.outcomes import Outcomes
from mizuoto_sdk.server.stream import Feeds
from mizuoto_sdk.server.uploads import (
    WAV_TYPES,
    check_request,
    read_body,
    stream_audio,
    upload_routes,
    with_seed,
)
from mizuoto_sdk.server.websocket import websocket_routes

PAGE = Path(__file__).with_name("page")
API = "/api/v1"

STATUS = {
    "invalid_request": 400,
    "capability_not_supported": 400,
    "engine_not_found": 404,
    "model_not_installed": 409,
    "cancelled": 499,  # the client closed the request (it rarely sees this answer)
    "engine_error": 500,
    "worker_failed": 502,
    "engine_unavailable": 503,
    "compute_unavailable": 503,
    "operation_timeout": 504,
}
"""HTTP status of each code of the error registry (``mizuoto_sdk.errors.ERROR_CODES``)."""

_WAV_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "16-bit PCM mono WAV, sent as it is made (sizes 0xFFFFFFFF: unknown)",
        "content": {"audio/wav": {}},
    }
}
MAX_RECORDING = 64 * 2**20
"""The largest WAV body ``POST /api/v1/voices`` takes (a voice needs seconds, not hours)."""
_WAV_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "the recording, a WAV file",
        "content": {"audio/wav": {"schema": {"type": "string", "format": "binary"}}},
    }
}
_HTTP_CODES = {
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    415: "unsupported_media_type",
}
_VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SynthesisBody(_Body):
    engine: str = Field(description="an engine id (GET /api/v1/engines)")
    text: str = Field(description="the words to say")
    params: dict[str, Any] = Field(default_factory=dict, description="the engine's params")
    seed: int | None = Field(default=None, ge=0, description="the same seed, the same audio")
    model: str | None = Field(default=None, description="a model id; default: the engine's")
    device: str | None = Field(default=None, description="default: the engine's device setting")


class UnloadBody(_Body):
    model: str | None = Field(
        default=None, description="an engine id or a model as listed; null: every idle model"
    )


class LoadBody(_Body):
    engine: str
    model: str | None = None
    device: str | None = None


def create_app(
    service: RuntimeService,
    *,
    token: str | None = None,
    loopback: bool = True,
    version: str = "unknown",
    home: Path | None = None,
) -> FastAPI:
    """The server's app over ``service``. ``token``: required on every request when set;
    ``loopback``: only loopback Host headers are accepted; ``home``: the data folder (default:
    ``MIZUOTO_HOME`` or the user's), whose ``voices`` POST /voices writes into, added to the
    setting ``voices.roots``. ``app.state.feeds`` holds the syntheses that stream now, for a
    server that stops (``Feeds.stop``)."""
    if home is None:
        from mizuoto_sdk.host.models import data_home

        home = data_home()
    voices = home / "voices"
    roots = [os.fspath(root) for root in service.settings.get("voices.roots") or ()]
    service.settings.set("voices.roots", [*roots, os.fspath(voices)])
    answer = answer_class(home)
    app = FastAPI(
        title="Mizuoto server",
        version=version,
        docs_url=None,  # Swagger's page loads scripts from a CDN: only the description is served
        redoc_url=None,
        openapi_url="/openapi.json",
        default_response_class=answer,
    )
    app.add_middleware(
        BodyLimit, own_limits=frozenset({f"{API}/voices", f"{API}/convert", f"{API}/edit"})
    )
    app.add_middleware(Access, token=token, loopback=loopback)
    app.state.feeds = Feeds()
    app.state.outcomes = Outcomes()
    _errors(app, answer)
    _routes(app, service, version, voices, app.state.feeds)
    app.include_router(
        upload_routes(service, app.state.feeds, app.state.outcomes, _open_for_work(app.state.feeds))
    )
    app.include_router(openai_routes(service, app.state.feeds, voices, STATUS))
    app.include_router(websocket_routes(service, app.state.feeds))
    app.mount("/page", StaticFiles(directory=PAGE), name="page")
    return app


def _errors(app: FastAPI, answer: type[JSONResponse]) -> None:
    def error_response(
        code: str, message: str, detail: dict[str, Any], status: int
    ) -> JSONResponse:
        return answer({"code": code, "message": message, "detail": detail}, status_code=status)

    @app.exception_handler(EngineError)
    async def engine_error(request: Request, error: EngineError) -> JSONResponse:
        return answer(public_error(error), status_code=STATUS.get(error.code, 500))

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = error.errors()
        first = problems[0] if problems else {}
        field = ".".join(str(part) for part in first.get("loc", ())[1:]) or "body"
        message = f"{field}: {first.get('msg', 'invalid')}"
        listed = [
            {"field": ".".join(map(str, p["loc"][1:])), "problem": p["msg"]} for p in problems
        ]
        return error_response("invalid_request", message, {"field": field, "problems": listed}, 400)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        """A failure no handler expected: the error shape still, the traceback in the log."""
        message = f"the server failed: {type(error).__name__}: {error}"
        return error_response("engine_error", message, {"path": request.url.path}, 500)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(error.status_code, "invalid_request")
        return error_response(
            code, str(error.detail), {"path": request.url.path}, error.status_code
        )


def _open_for_work(feeds: Feeds) -> Callable[[], None]:
    """A check that refuses new work once the server stops."""

    def check() -> None:
        if feeds.stopping:
            raise EngineUnavailable(
                "the server is stopping: it takes no new work", {"reason": "stopping"}
            )

    return check


def _routes(
    app: FastAPI, service: RuntimeService, version: str, voices: Path, feeds: Feeds
) -> None:
    outcomes: Outcomes = app.state.outcomes

    open_for_work = _open_for_work(feeds)

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(PAGE / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get(f"{API}/health")
    def health() -> dict[str, object]:
        return {"status": "ok", "pid": os.getpid(), "version": version}

    @app.get(f"{API}/engines")
    def engines() -> list[dict[str, Any]]:
        return [dict(row) for row in service.describe_engines()]

    @app.get(f"{API}/engines/{{engine_id}}/doctor")
    def engine_doctor(engine_id: str) -> dict[str, Any]:
        return dict(service.doctor(engine_id))

    @app.get(f"{API}/runtime/doctor")
    def runtime_doctor() -> dict[str, Any]:
        return dict(service.doctor())

    @app.get(f"{API}/runtime")
    def runtime() -> dict[str, Any]:
        return {"pid": os.getpid(), "models": jsonable(service.describe_models())}

    @app.post(f"{API}/runtime/unload")
    def unload(body: UnloadBody) -> dict[str, Any]:
        known = _unloadable(service) if body.model is not None else set()
        if body.model is not None and body.model not in known:
            raise InvalidRequest(
                f"model: no loaded model or engine {body.model!r}",
                {"field": "model", "known": sorted(known)},
            )
        return {"unloaded": service.unload(body.model)}

    @app.post(f"{API}/runtime/load")
    def load(body: LoadBody) -> dict[str, Any]:
        open_for_work()
        model = service.load(body.engine, body.model, device=body.device)
        model.start()
        return {"model": model.name}

    @app.post(f"{API}/synthesize", responses=_WAV_RESPONSE)
    async def synthesize(body: SynthesisBody, request: Request) -> Response:
        """Audio as it is made (16-bit PCM mono WAV); a client that leaves cancels the request."""
        open_for_work()
        return await stream_audio(
            request,
            feeds,
            outcomes,
            body.engine,
            lambda: _prepare(service, body),
            lambda model, call: model.synthesize(body.text, call),
            "text",
        )

    @app.get(f"{API}/requests/{{request_id}}")
    def outcome(request_id: str) -> dict[str, Any]:
        """How a recent synthesis ended (its ``X-Mizuoto-Request`` id): ``streaming``, ``done``,
        ``cancelled`` or ``failed`` with its error; a cut stream's answer says why here.
        ``waiting_for_client``: the engine is held back until the client reads what it made."""
        found = outcomes.get(request_id)
        if found is None:
            raise HTTPException(404, f"no recent request {request_id!r}")
        feed = feeds.get(request_id)
        if feed is not None:  # streaming: what the client has been sent so far
            found["chunks"] = feed.sent
        found["waiting_for_client"] = feed is not None and feed.waiting
        return found

    @app.post(f"{API}/voices", openapi_extra=_WAV_BODY)
    async def prepare_voice(
        request: Request,
        engine: str = Query(description="an engine id with the prepare_voice capability"),
        name: str = Query(description="the voice's name: letters, digits, '.', '_', '-'"),
        model: str | None = Query(default=None),
        seed: int | None = Query(default=None, ge=0),
    ) -> dict[str, Any]:
        """The engine's ``prepare_voice`` on the WAV body (at most ``MAX_RECORDING`` bytes),
        written into ``voices/ENGINE/NAME`` in the data folder; ``voice`` in the answer,
        ``ENGINE/NAME``, is what ``params.voice`` of a synthesis takes."""
        open_for_work()
        if not _VOICE_NAME.fullmatch(name):
            raise InvalidRequest(
                f"name: {name!r} is not a voice name: up to 64 letters, digits, '.', '_' or "
                "'-', beginning with a letter or digit",
                {"field": "name"},
            )
        audio = await read_body(request, MAX_RECORDING, WAV_TYPES, "the recording")
        folder = voices / engine / name

        def prepare() -> dict[str, Any]:
            recording = parse_wav(audio, "audio", "the request body")
            params: dict[str, Any] = {} if seed is None else {"seed": seed}
            check_request(service, engine, "prepare_voice", params, model)
            served = service.load(engine, model)
            result = served.prepare_voice(recording, folder, EngineRequest(params=params))
            voice = f"{engine}/{name}"  # found in the voices folder, one of voices.roots
            return {"name": name, "voice": voice, "result": jsonable(result or {})}

        answer: dict[str, Any] = await run_in_threadpool(prepare)
        return answer


def _prepare(service: RuntimeService, body: SynthesisBody) -> tuple[Any, EngineRequest]:
    """The model and the request of a synthesis, loaded and checked before the answer begins."""
    params = with_seed(body.params, body.seed)
    if not body.text.strip():
        raise InvalidRequest("text: is empty; give the words to synthesize", {"field": "text"})
    check_request(service, body.engine, "synthesize", params, body.model)
    model = service.load(body.engine, body.model, device=body.device)
    return model, EngineRequest(params=params)


def _unloadable(service: RuntimeService) -> set[str]:
    """What ``unload`` accepts: the loaded models by name and owner, and every engine id."""
    models = service.describe_models()
    return (
        {m["name"] for m in models}
        | {m["owner"] for m in models}
        | {record.id for record in service.discovery.records()}
    )
