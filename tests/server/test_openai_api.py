"""The OpenAI speech API of ``mizuoto serve``, asked by the official ``openai`` client."""

from __future__ import annotations

import base64
import io
import json
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
from server_support import RunningServer

from mizuoto_sdk.audio import pcm16
from mizuoto_sdk.host import EngineRequest, RuntimeService

pytest.importorskip("openai", reason="the OpenAI route's tests need the openai client")
pytest.importorskip("soundfile", reason="the encoded formats are read back by it")
import openai
import soundfile  # type: ignore[import-untyped]

HANG_AFTER_FIRST = {"fault": "hang_cancellable", "at": 1, "chunks": 3}


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    """The official client, pointed at the server; no retries, so that a test sees each error."""
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def host_samples(engine: str, text: str, params: dict[str, object]) -> np.ndarray:
    """What the host in this process makes of the request (``mizuoto synth``'s synthesis)."""
    with RuntimeService() as service:
        chunks = list(service.load(engine).synthesize(text, EngineRequest(params=dict(params))))
    return np.concatenate([c.samples for c in chunks])


def wav_pcm(body: bytes) -> tuple[int, bytes]:
    assert body[:4] == b"RIFF" and body[36:40] == b"data"
    return struct.unpack_from("<I", body, 24)[0], body[44:]


def model_state(server: RunningServer, engine: str) -> list[str]:
    models = server.client.get("/api/v1/runtime").json()["models"]
    return [m["state"] for m in models if m["engine"] == engine]


def wait_for(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_speech_is_the_hosts_synthesis_with_speed_and_seed(client: openai.OpenAI) -> None:
    answer = client.audio.speech.create(
        model="sine:tone",
        input="hello server",
        voice="alloy",  # OpenAI's voice names are the engine's default voice
        response_format="wav",
        speed=1.5,
        extra_body={"seed": 7},
    )
    rate, pcm = wav_pcm(answer.content)
    assert rate == 16000
    assert pcm == pcm16(host_samples("sine", "hello server", {"seed": 7, "speed": 1.5}))


def test_pcm_is_24_khz_16_bit_the_hosts_samples_at_that_rate(client: openai.OpenAI) -> None:
    codec = client.audio.speech.create(
        model="codeclm", input="hi", voice="default", response_format="pcm", extra_body={"seed": 3}
    )
    assert codec.content == pcm16(host_samples("codeclm", "hi", {"seed": 3}))  # a 24 kHz engine
    sine = host_samples("sine", "a b", {"seed": 1})  # 16 kHz: resampled to 24 kHz
    tones = client.audio.speech.create(
        model="sine", input="a b", voice="default", response_format="pcm", extra_body={"seed": 1}
    )
    assert abs(len(tones.content) // 2 - len(sine) * 3 // 2) <= 1


def test_flac_holds_the_wavs_samples_and_mp3_and_opus_decode(client: openai.OpenAI) -> None:
    def speak(response_format: Literal["wav", "flac", "mp3", "opus"]) -> bytes:
        return client.audio.speech.create(
            model="sine",
            input="one two",
            voice="default",
            response_format=response_format,
            extra_body={"seed": 2},
        ).content

    _, pcm = wav_pcm(speak("wav"))
    flac, rate = soundfile.read(io.BytesIO(speak("flac")), dtype="int16")
    assert rate == 16000 and flac.tobytes() == pcm
    lossy_formats: tuple[Literal["mp3", "opus"], ...] = ("mp3", "opus")
    for lossy in lossy_formats:
        audio, rate = soundfile.read(io.BytesIO(speak(lossy)))
        assert rate in (16000, 48000) and abs(len(audio) / rate - len(pcm) / 32000) < 0.1


def test_the_first_bytes_come_before_the_synthesis_ends_and_leaving_stops_it(
    client: openai.OpenAI, server: RunningServer
) -> None:
    """The engine yields one chunk, then waits for the cancel only a disconnect sends."""
    with client.audio.speech.with_streaming_response.create(
        model="faulty",
        input="x",
        voice="default",
        response_format="pcm",
        extra_body={"seed": 1, **HANG_AFTER_FIRST},
    ) as answer:
        received = answer.iter_bytes()  # held: dropped, it closes the connection when collected
        first = next(received)
        assert len(first) > 0
        assert model_state(server, "faulty") == ["busy"], server.log_text()[-3000:]
    left = wait_for(lambda: model_state(server, "faulty") == ["idle"], seconds=20)
    assert left, f"disconnect did not cancel:\n{server.log_text()[-3000:]}"


def test_sse_deltas_carry_the_audio_then_done(client: openai.OpenAI) -> None:
    whole = client.audio.speech.create(
        model="sine", input="a b c", voice="default", response_format="wav", extra_body={"seed": 4}
    ).content
    with client.audio.speech.with_streaming_response.create(
        model="sine",
        input="a b c",
        voice="default",
        response_format="wav",
        stream_format="sse",
        extra_body={"seed": 4},
    ) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in answer.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert [e["type"] for e in events[-1:]] == ["speech.audio.done"]
    deltas = [e for e in events[:-1] if e["type"] == "speech.audio.delta"]
    assert len(deltas) == len(events) - 1 > 1
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == whole


@pytest.mark.parametrize(
    ("fields", "error", "param", "says"),
    [
        ({"model": "nothing"}, "NotFoundError", None, "no engine 'nothing'"),
        ({"model": "sine:huge"}, "BadRequestError", "model", "no model 'huge'"),
        ({"voice": "gravel"}, "BadRequestError", "voice", "its voices: default"),
        ({"response_format": "aac"}, "BadRequestError", "response_format", "wav, pcm"),
        ({"model": "codeclm", "speed": 2.0}, "BadRequestError", "speed", "no speed param"),
        ({"speed": 9.0}, "BadRequestError", "speed", "in [0.25, 4]"),
        ({"extra_body": {"colour": "red"}}, "BadRequestError", "colour", "params: seed, speed"),
        ({"input": "  "}, "BadRequestError", "input", "non-empty"),
        (
            {"model": "faulty", "extra_body": {"fault": "crash", "at": 0}},
            "InternalServerError",
            None,
            "RuntimeError",
        ),
    ],
)
def test_errors_are_openais_typed_exceptions_with_the_servers_message(
    client: openai.OpenAI, fields: dict[str, object], error: str, param: str | None, says: str
) -> None:
    request: dict[str, Any] = {"model": "sine", "input": "x", "voice": "default"}
    request.update(fields)
    with pytest.raises(getattr(openai, error)) as raised:
        client.audio.speech.create(**request)
    body = raised.value.body
    assert isinstance(body, dict) and set(body) == {"message", "type", "param", "code"}
    assert says in body["message"] and says in raised.value.message
    if param is not None:
        assert body["param"] == param


def test_models_and_voices_list_every_synthesizing_engine(
    client: openai.OpenAI, server: RunningServer
) -> None:
    ids = {model.id for model in client.models.list()}
    assert {"sine", "sine:tone", "codeclm", "codeclm:tiny", "faulty"} <= ids
    voices = server.client.get("/v1/audio/voices").json()["voices"]
    assert {"id": "default", "name": "default", "model": "sine"} in voices
    one = server.client.get("/v1/audio/voices", params={"model": "sine:tone"}).json()
    assert one == {"voices": [{"id": "default", "name": "default", "model": "sine"}]}
    missing = server.client.get("/v1/audio/voices", params={"model": "nothing"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_the_routes_keep_the_servers_host_and_token_rules(server: RunningServer) -> None:
    rebound = server.client.get("/v1/models", headers={"host": "attacker.example"})
    assert rebound.status_code == 400 and rebound.json()["detail"]["field"] == "host"
    form = server.client.post(
        "/v1/audio/speech", content=b"model=sine", headers={"content-type": "text/plain"}
    )
    assert form.status_code == 415


def test_a_server_with_a_token_wants_it_as_the_clients_api_key(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from mizuoto_sdk.server.app import create_app

    with RuntimeService() as service:
        app = create_app(service, token="the-token", home=tmp_path)
        with TestClient(app, base_url="http://127.0.0.1") as http:

            def client(key: str) -> openai.OpenAI:
                url = "http://127.0.0.1/v1"
                return openai.OpenAI(base_url=url, api_key=key, http_client=http, max_retries=0)

            with pytest.raises(openai.AuthenticationError, match="needs its token"):
                client("a-guess").models.list()
            assert "sine" in {model.id for model in client("the-token").models.list()}
