"""``WebSocket /api/v1/synthesize/stream`` of ``mizuoto serve``, asked by the ``websockets``
client: text in as it is written, audio out as it is made."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from server_support import RunningServer

from mizuoto_sdk.audio import pcm16
from mizuoto_sdk.host import EngineRequest, RuntimeService

pytest.importorskip("websockets", reason="the WebSocket route's tests need websockets")
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

TIMEOUT = 30.0


def host_pcm(engine: str, text: str, params: dict[str, object]) -> bytes:
    with RuntimeService() as service:
        chunks = list(service.load(engine).synthesize(text, EngineRequest(params=dict(params))))
    return pcm16(np.concatenate([c.samples for c in chunks]))


def ws_url(server: RunningServer) -> str:
    return server.url.replace("http://", "ws://") + "/api/v1/synthesize/stream"


def rest_of_stream(socket: ClientConnection) -> tuple[bytes, dict[str, object]]:
    """The PCM received until the last JSON message, and that message."""
    pcm = b""
    while True:
        message = socket.recv(timeout=TIMEOUT)
        if isinstance(message, bytes):
            pcm += message
        else:
            return pcm, json.loads(message)


def test_audio_starts_before_the_text_ends_and_is_the_hosts_of_the_joined_text(
    server: RunningServer,
) -> None:
    params = {"seed": 3, "speed": 2.0}
    with connect(ws_url(server)) as socket:
        socket.send(json.dumps({"engine": "sine", "params": params}))
        socket.send(json.dumps({"text": "Hello there. How"}))
        hello = json.loads(socket.recv(timeout=TIMEOUT))
        assert hello["sample_rate"] == 16000 and hello["request"]
        first = socket.recv(timeout=TIMEOUT)  # the first sentence speaks before the rest comes
        assert isinstance(first, bytes) and first
        socket.send(json.dumps({"text": " are you?"}))
        socket.send(json.dumps({"end": True}))
        pcm, last = rest_of_stream(socket)
    assert last == {"done": True}
    # sine declares text_input: one call, fed the pieces, gives the joined text's audio
    assert first + pcm == host_pcm("sine", "Hello there. How are you?", params)


def test_an_engine_without_text_input_speaks_each_finished_sentence(server: RunningServer) -> None:
    params = {"seed": 3, "max_frames": 4}
    with connect(ws_url(server)) as socket:
        socket.send(json.dumps({"engine": "codeclm", "params": params}))
        socket.send(json.dumps({"text": "Hello there. How"}))
        json.loads(socket.recv(timeout=TIMEOUT))
        first = socket.recv(timeout=TIMEOUT)  # the first sentence speaks before the rest comes
        assert isinstance(first, bytes) and first
        socket.send(json.dumps({"text": " are you?", "end": True}))
        pcm, last = rest_of_stream(socket)
    assert last == {"done": True}
    sentences = ["Hello there. ", "How are you?"]
    assert first + pcm == b"".join(host_pcm("codeclm", s, params) for s in sentences)


def test_a_bad_request_is_an_error_message(server: RunningServer) -> None:
    with connect(ws_url(server)) as socket:
        socket.send(json.dumps({"engine": "sine", "params": {"bogus": 1}}))
        _, last = rest_of_stream(socket)
    error = last["error"]
    assert isinstance(error, dict) and error["code"] == "invalid_request"
    assert error["detail"]["field"] == "params.bogus"


def test_closing_the_socket_cancels_the_engine(server: RunningServer) -> None:
    hang = {"seed": 1, "fault": "hang_cancellable", "at": 1, "chunks": 3}
    with connect(ws_url(server)) as socket:
        socket.send(json.dumps({"engine": "faulty", "params": hang}))
        socket.send(json.dumps({"text": "x", "end": True}))
        json.loads(socket.recv(timeout=TIMEOUT))
        assert isinstance(socket.recv(timeout=TIMEOUT), bytes)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        models = server.client.get("/api/v1/runtime").json()["models"]
        if [m["state"] for m in models if m["engine"] == "faulty"] == ["idle"]:
            return
        time.sleep(0.02)
    raise AssertionError("closing the socket did not cancel the engine")


def test_another_sites_page_and_another_host_are_refused(server: RunningServer) -> None:
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url(server), additional_headers={"Origin": "http://attacker.example"}).close()
    assert refused.value.response.status_code == 403
    upgrade = {
        "host": "attacker.example",  # a rebound name: the handshake itself, one Host header
        "connection": "Upgrade",
        "upgrade": "websocket",
        "sec-websocket-version": "13",
        "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    assert server.client.get("/api/v1/synthesize/stream", headers=upgrade).status_code == 403
