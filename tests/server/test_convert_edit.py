"""``POST /api/v1/convert`` and ``POST /api/v1/edit`` of a real ``mizuoto serve``: a WAV file and
a JSON request as ``multipart/form-data`` in, audio streamed out."""

from __future__ import annotations

import io
import json
import struct
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from server_support import SERVING_SITE, RunningServer

from mizuoto_sdk import AudioChunk, Engine, EngineManifest, LoadedEngine, ModelEntry, hookimpl
from mizuoto_sdk.audio import UNKNOWN_SIZE, parse_wav, pcm16, write_wav
from mizuoto_sdk.discovery import Discovery
from mizuoto_sdk.host import EngineRequest, RuntimeService

CLIENT = {"X-Mizuoto-Client": "test"}  # a header no form sets: what lets a multipart body in


def wav_file(samples: int = 4000, rate: int = 16000) -> bytes:
    noise = np.random.default_rng(7).uniform(-0.5, 0.5, samples).astype(np.float32)
    out = io.BytesIO()
    write_wav(out, noise, rate)
    return out.getvalue()


def upload(
    server: RunningServer,
    path: str,
    request: object,
    audio: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    files: dict[str, tuple[str | None, bytes, str]] = {}
    files["audio"] = ("in.wav", wav_file() if audio is None else audio, "audio/wav")
    text = request if isinstance(request, str) else json.dumps(request)
    files["request"] = (None, text.encode(), "application/json")
    return server.client.post(path, files=files, headers=CLIENT if headers is None else headers)


def pcm_of(body: bytes) -> tuple[int, bytes]:
    assert body[:4] == b"RIFF" and struct.unpack_from("<I", body, 40)[0] == UNKNOWN_SIZE
    return struct.unpack_from("<I", body, 24)[0], body[44:]


def test_convert_streams_what_the_hosts_convert_makes(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    params = {"chunks": 3}
    answer = upload(server, "/api/v1/convert", {"engine": "faulty", "params": params, "seed": 5})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "audio/wav"
    rate, pcm = pcm_of(answer.content)
    monkeypatch.syspath_prepend(str(SERVING_SITE))
    with RuntimeService() as service:
        request = EngineRequest(params={**params, "seed": 5})
        chunks = list(service.load("faulty").convert(parse_wav(wav_file()), request))
    assert rate == 16000 and len(chunks) == 3
    assert pcm == pcm16(np.concatenate([c.samples for c in chunks]))
    outcome = server.client.get(f"/api/v1/requests/{answer.headers['x-mizuoto-request']}")
    assert outcome.json()["state"] == "done" and outcome.json()["chunks"] == 3


def test_the_first_chunk_comes_before_the_engine_ends_and_leaving_cancels(
    server: RunningServer,
) -> None:
    hang = {"fault": "hang_cancellable", "at": 1, "chunks": 3, "seed": 1}
    multipart = {
        "audio": ("in.wav", wav_file(), "audio/wav"),
        "request": (None, json.dumps({"engine": "faulty", "params": hang}).encode()),
    }
    with server.client.stream("POST", "/api/v1/convert", files=multipart, headers=CLIENT) as got:
        assert got.status_code == 200
        request_id = got.headers["x-mizuoto-request"]
        pieces = got.iter_raw()  # held: a dropped iterator closes the connection
        first = next(pieces)  # the engine hangs after its first chunk: it came streamed
        assert first[:4] == b"RIFF"
        assert server.client.get(f"/api/v1/requests/{request_id}").json()["state"] == "streaming"
    end = time.monotonic() + 10
    while time.monotonic() < end:
        if server.client.get(f"/api/v1/requests/{request_id}").json()["state"] == "cancelled":
            return
        time.sleep(0.02)  # polling the server's record of another process's work, bounded
    raise AssertionError("leaving the stream did not cancel the convert")


@pytest.mark.parametrize(
    ("request_part", "status", "field"),
    [
        ("{not json", 400, "request"),
        ({"engine": "faulty", "bogus": 1}, 400, "request.bogus"),
        ({"params": {}}, 400, "request.engine"),
        ({"engine": "faulty", "seed": 1, "params": {"seed": 2}}, 400, "request.seed"),
        ({"engine": "faulty", "params": {"chunks": 0}}, 400, "params.chunks"),
    ],
    ids=["not-json", "unknown-field", "no-engine", "two-seeds", "bad-param"],
)
def test_a_bad_request_part_is_a_400_naming_the_field(
    server: RunningServer, request_part: object, status: int, field: str
) -> None:
    answer = upload(server, "/api/v1/convert", request_part)
    assert answer.status_code == status, answer.text
    assert answer.json()["detail"]["field"] == field


def test_a_file_that_is_not_wav_is_a_415(server: RunningServer) -> None:
    answer = upload(server, "/api/v1/convert", {"engine": "faulty"}, audio=b"ID3\x03 an mp3")
    assert answer.status_code == 415, answer.text
    assert answer.json()["code"] == "unsupported_media_type"
    assert "audio" in answer.json()["message"]


def test_a_missing_part_and_a_body_that_is_not_multipart_are_refused(
    server: RunningServer,
) -> None:
    only_request = {"request": (None, b'{"engine": "faulty"}')}
    answer = server.client.post("/api/v1/convert", files=only_request, headers=CLIENT)
    assert answer.status_code == 400 and answer.json()["detail"]["field"] == "audio"
    as_json = {**CLIENT, "content-type": "application/json"}
    answer = server.client.post("/api/v1/convert", content=b"{}", headers=as_json)
    assert answer.status_code == 415 and "multipart/form-data" in answer.json()["message"]


def test_a_multipart_body_without_a_programs_header_is_refused_as_cross_site(
    server: RunningServer,
) -> None:
    """A form on any page can post multipart/form-data: it carries neither header."""
    answer = upload(server, "/api/v1/convert", {"engine": "faulty"}, headers={})
    assert answer.status_code == 415, answer.text
    assert answer.json()["detail"]["field"] == "content-type"


def test_edit_needs_an_engine_that_edits_and_the_text(server: RunningServer) -> None:
    answer = upload(server, "/api/v1/edit", {"engine": "faulty", "text": "hello"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "capability_not_supported"
    assert answer.json()["detail"]["capability"] == "edit"
    answer = upload(server, "/api/v1/edit", {"engine": "faulty"})
    assert answer.status_code == 400 and answer.json()["detail"]["field"] == "request.text"


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_an_upload_past_the_limit_is_refused_before_it_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, declared: bool
) -> None:
    from starlette.testclient import TestClient

    from mizuoto_sdk.server import uploads
    from mizuoto_sdk.server.app import create_app

    monkeypatch.setattr(uploads, "MAX_UPLOAD", 1000)
    data = b"--x\r\n" + bytes(4000)
    content = data if declared else iter([data[:1500], data[1500:]])
    headers = {**CLIENT, "content-type": "multipart/form-data; boundary=x"}
    with RuntimeService() as service:
        app = create_app(service, home=tmp_path)
        with TestClient(app, base_url="http://127.0.0.1") as client:
            answer = client.post("/api/v1/convert", content=content, headers=headers)
    assert answer.status_code == 400, answer.text
    assert answer.json()["detail"] == {"field": "audio", "limit_bytes": 1000}


class Editor(Engine):
    """An engine that edits: the audio scaled by the number of words, in two chunks, plus seeded
    noise (so the seed matters)."""

    def load(self, spec: Any, runtime: Any, ctx: Any) -> LoadedEngine:
        return LoadedEditor()


class LoadedEditor(LoadedEngine):
    def describe(self) -> Mapping[str, object]:
        return {}

    def edit(
        self, audio: AudioChunk, text: str, params: Mapping[str, object], ctx: Any
    ) -> Iterator[AudioChunk]:
        samples = np.asarray(audio.samples, np.float32) * len(text.split()) * 0.1
        samples = samples + ctx.rng.standard_normal(samples.shape).astype(np.float32) * 0.01
        half = samples.shape[-1] // 2
        for part in (samples[:half], samples[half:]):
            yield AudioChunk(part, audio.sample_rate)


class EditorPlugin:
    @hookimpl
    def mizuoto_engines(self) -> list[EngineManifest]:
        return [
            EngineManifest(
                id="editor",
                implementation=f"{__name__}:Editor",
                models=[ModelEntry("default")],
                capabilities=["edit"],
                devices=["cpu"],
                stochastic=True,
                uses_torch=False,
            )
        ]


def test_edit_streams_what_the_hosts_edit_makes(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from mizuoto_sdk.server.app import create_app

    discovery = Discovery(
        plugins={"editor-dist": EditorPlugin()}, entry_points=False, selection=None
    )
    recording = wav_file()
    files = {
        "audio": ("in.wav", recording, "audio/wav"),
        "request": (None, json.dumps({"engine": "editor", "text": "say it twice", "seed": 3})),
    }
    with RuntimeService({"engines.editor.deployment": "inline"}, discovery) as service:
        request = EngineRequest(params={"seed": 3})
        chunks = list(service.load("editor").edit(parse_wav(recording), "say it twice", request))
        app = create_app(service, home=tmp_path)
        with TestClient(app, base_url="http://127.0.0.1") as client:
            answer = client.post("/api/v1/edit", files=files, headers=CLIENT)
            assert answer.status_code == 200, answer.text
            outcome = client.get(f"/api/v1/requests/{answer.headers['x-mizuoto-request']}")
    assert pcm_of(answer.content) == (16000, pcm16(np.concatenate([c.samples for c in chunks])))
    assert outcome.json()["state"] == "done" and outcome.json()["chunks"] == 2
