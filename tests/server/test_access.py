"""One set of access rules for every route of the server: the native API, the OpenAI speech API
and the WebSocket stream all refuse a missing token, a rebound Host name and another site's
page, in ``access.Access`` before any route runs (in process, over ``create_app``)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the server's tests need fastapi (requirements-dev.txt)")
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from mizuoto_sdk.audio import write_wav
from mizuoto_sdk.host import RuntimeService
from mizuoto_sdk.server.access import POLICY
from mizuoto_sdk.server.app import create_app

TOKEN = "a-token-for-the-tests"
AUTHORIZED = {"Authorization": f"Bearer {TOKEN}"}
SPEECH = {"model": "sine", "input": "a b", "voice": "default", "response_format": "wav"}
ROUTES = [
    ("GET", "/api/v1/engines", None),
    ("POST", "/api/v1/synthesize", {"engine": "sine", "text": "a b"}),
    ("GET", "/v1/models", None),
    ("POST", "/v1/audio/speech", SPEECH),
]
IDS = ["native-get", "native-post", "openai-get", "openai-post"]
STREAM = "ws://127.0.0.1:7370/api/v1/synthesize/stream"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """A server with a token, bound to loopback."""
    home = tmp_path_factory.mktemp("access")
    with RuntimeService() as service:
        app = create_app(service, token=TOKEN, loopback=True, home=Path(home))
        with TestClient(app, base_url="http://127.0.0.1:7370") as test_client:
            yield test_client


def ask(
    client: TestClient, method: str, path: str, body: object, headers: dict[str, str]
) -> tuple[int, str]:
    answer = client.request(method, path, json=body, headers=headers)
    document = answer.json() if "json" in answer.headers["content-type"] else None
    return answer.status_code, document.get("code", "") if isinstance(document, dict) else ""


def opened(client: TestClient, headers: dict[str, str]) -> int | None:
    """The close code of a refused WebSocket handshake, None when it was accepted."""
    try:
        with client.websocket_connect(STREAM, headers=headers) as socket:
            socket.close()
    except WebSocketDisconnect as refused:
        return refused.code
    return None


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=IDS)
def test_every_http_route_needs_the_token_and_passes_with_it(
    client: TestClient, method: str, path: str, body: object
) -> None:
    assert ask(client, method, path, body, {}) == (401, "unauthorized")
    status, _ = ask(client, method, path, body, AUTHORIZED)
    assert status == 200


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=IDS)
def test_every_http_route_refuses_a_rebound_host_and_another_sites_page(
    client: TestClient, method: str, path: str, body: object
) -> None:
    rebound = {**AUTHORIZED, "Host": "attacker.example"}
    assert ask(client, method, path, body, rebound) == (400, "invalid_request")
    if method == "POST":  # a page elsewhere may read nothing, but must change nothing
        elsewhere = {**AUTHORIZED, "Origin": "http://attacker.example"}
        assert ask(client, method, path, body, elsewhere) == (403, "forbidden")


def test_the_websocket_route_has_the_same_rules(client: TestClient) -> None:
    assert opened(client, {}) == POLICY  # no token
    assert opened(client, {**AUTHORIZED, "Host": "attacker.example"}) == POLICY
    assert opened(client, {**AUTHORIZED, "Origin": "http://attacker.example"}) == POLICY
    assert opened(client, {**AUTHORIZED, "Origin": "http://127.0.0.1:7370"}) is None
    assert opened(client, {"Cookie": f"mizuoto_token={TOKEN}"}) is None  # the page's cookie


def test_a_multipart_upload_needs_a_header_no_form_sets(client: TestClient) -> None:
    recording = io.BytesIO()
    write_wav(recording, np.zeros(160, dtype=np.float32), 16000)
    files: dict[str, tuple[str | None, bytes, str]] = {
        "audio": ("a.wav", recording.getvalue(), "audio/wav"),
        "request": (None, b"{}", "application/json"),
    }
    cookie = {"Cookie": f"mizuoto_token={TOKEN}"}
    form = client.post("/api/v1/convert", files=files, headers=cookie)
    assert form.status_code == 415 and form.json()["detail"]["field"] == "content-type"
    page = {**cookie, "X-Mizuoto-Client": "page"}
    answer = client.post("/api/v1/convert", files=files, headers=page)
    assert answer.status_code == 400 and answer.json()["detail"]["field"] == "request.engine"
