"""The server's HTTP API against a real ``mizuoto serve`` on a loopback port (``server``)."""

from __future__ import annotations

import io
import json
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
from server_support import RunningServer

from mizuoto_sdk.audio import UNKNOWN_SIZE, pcm16, write_wav
from mizuoto_sdk.errors import ERROR_CODES
from mizuoto_sdk.host import EngineRequest, RuntimeService
from mizuoto_sdk.server.stream import AHEAD

HANG_AFTER_FIRST = {"fault": "hang_cancellable", "at": 1, "chunks": 3}


def pcm_of(body: bytes) -> tuple[int, bytes]:
    """The sample rate and the PCM of a streamed WAV, checking its header on the way."""
    assert body[:4] == b"RIFF" and body[8:16] == b"WAVEfmt "
    assert struct.unpack_from("<I", body, 4)[0] == UNKNOWN_SIZE
    tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", body, 20)
    assert (tag, channels, bits) == (1, 1, 16)
    assert body[36:40] == b"data" and struct.unpack_from("<I", body, 40)[0] == UNKNOWN_SIZE
    return rate, body[44:]


def host_pcm(engine: str, text: str, params: dict[str, object]) -> bytes:
    """What the host in this process makes of the same request, as the server's PCM."""
    with RuntimeService() as service:
        chunks = list(service.load(engine).synthesize(text, EngineRequest(params=dict(params))))
    return pcm16(np.concatenate([c.samples for c in chunks]))


def model_state(server: RunningServer, engine: str) -> list[str]:
    models = server.client.get("/api/v1/runtime").json()["models"]
    return [m["state"] for m in models if m["engine"] == engine]


def wav_recording(samples: int = 1600, rate: int = 16000) -> bytes:
    recording = io.BytesIO()
    write_wav(recording, np.zeros(samples, dtype=np.float32), rate)
    return recording.getvalue()


def chunks_computed(log: Path) -> int:
    """How many chunks the witness engine has yielded, from its log."""
    lines = log.read_text().splitlines() if log.exists() else []
    return sum(line.startswith("chunk ") for line in lines)


def wait_for(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Poll another process's state (its API) until ``condition`` holds, at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_server_json_names_the_running_server_readable_by_its_owner_only(
    server: RunningServer,
) -> None:
    path = server.home / "server.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    record = json.loads(path.read_text())
    assert record["pid"] == server.pid and record["token"] is None
    assert record["url"] == f"http://127.0.0.1:{record['port']}"
    health = server.client.get("/api/v1/health").json()
    assert health == {"status": "ok", "pid": server.pid, "version": record["version"]}


def test_engines_are_what_mizuoto_engines_json_prints(server: RunningServer) -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "mizuoto_sdk.cli", "engines", "--json"],
        env=server.env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert server.client.get("/api/v1/engines").json() == json.loads(listed.stdout)


def test_doctor_of_one_engine_of_all_and_of_an_unknown_one(server: RunningServer) -> None:
    one = server.client.get("/api/v1/engines/sine/doctor").json()
    assert [e["id"] for e in one["engines"]] == ["sine"] and one["engines"][0]["available"]
    every = server.client.get("/api/v1/runtime/doctor").json()
    assert {"sine", "codeclm", "faulty"} <= {e["id"] for e in every["engines"]}
    assert every["torch"]["installed"] is True
    unknown = server.client.get("/api/v1/engines/nope/doctor")
    assert unknown.status_code == 404
    assert unknown.json()["code"] == "engine_not_found" and "sine" in unknown.json()["message"]


def test_synthesis_streams_the_hosts_audio_as_a_wav(server: RunningServer) -> None:
    body = {"engine": "sine", "text": "hello server", "seed": 7, "params": {"speed": 1.5}}
    answer = server.client.post("/api/v1/synthesize", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "audio/wav"
    assert answer.headers.get("transfer-encoding") == "chunked"
    rate, pcm = pcm_of(answer.content)
    assert rate == int(answer.headers["x-mizuoto-sample-rate"])
    assert pcm == host_pcm("sine", "hello server", {"seed": 7, "speed": 1.5})


def test_the_first_bytes_arrive_while_the_engine_is_still_synthesizing(
    server: RunningServer,
) -> None:
    """The engine yields one chunk, then waits for a cancel that only the disconnect sends: the
    first bytes can only have come before the synthesis ended, and leaving stops it."""
    body = {"engine": "faulty", "text": "x", "seed": 1, "params": HANG_AFTER_FIRST}
    with server.client.stream("POST", "/api/v1/synthesize", json=body) as answer:
        assert answer.status_code == 200
        received = answer.iter_raw()  # held: dropped, it closes the connection when collected
        _, pcm = pcm_of(next(received))
        assert len(pcm) == 2 * 1600  # the header and the whole first chunk (chunk_samples)
        assert float(answer.headers["x-mizuoto-first-chunk"]) >= 0
        assert model_state(server, "faulty") == ["busy"], server.log_text()[-3000:]
    assert wait_for(lambda: model_state(server, "faulty") == ["idle"]), "disconnect did not cancel"


def test_a_client_that_leaves_before_the_first_chunk_cancels_the_request(
    server: RunningServer,
) -> None:
    body = {
        "engine": "faulty",
        "text": "x",
        "seed": 1,
        "params": {"fault": "hang_cancellable", "at": 0},
    }
    with pytest.raises(httpx.ReadTimeout):
        server.client.post("/api/v1/synthesize", json=body, timeout=httpx.Timeout(60, read=1.5))
    assert wait_for(lambda: model_state(server, "faulty") == ["idle"]), "disconnect did not cancel"


def test_concurrent_syntheses_each_get_what_one_caller_alone_gets(server: RunningServer) -> None:
    seeds = [1, 2, 3, 4, 5, 6]

    def synthesize(seed: int) -> bytes:
        body = {"engine": "sine", "text": f"voice {seed % 3}", "seed": seed}
        answer = server.client.post("/api/v1/synthesize", json=body)
        assert answer.status_code == 200, answer.text
        return pcm_of(answer.content)[1]

    alone = {seed: synthesize(seed) for seed in seeds}
    together: dict[int, bytes] = {}
    threads = [
        threading.Thread(target=lambda s=seed: together.__setitem__(s, synthesize(s)))
        for seed in seeds * 2
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({"engine": "nope", "text": "x"}, 404, "engine_not_found", "engine"),
        ({"engine": "sine", "text": "x", "params": {"bogus": 1}}, 400, "invalid_request", None),
        ({"engine": "sine", "text": "x", "params": {"speed": -1}}, 400, "invalid_request", None),
        ({"engine": "sine", "text": "   "}, 400, "invalid_request", "text"),
        ({"engine": "sine"}, 400, "invalid_request", "text"),
        ({"engine": "sine", "text": "x", "seed": -1}, 400, "invalid_request", "seed"),
        ({"engine": "sine", "text": "x", "seed": 1, "params": {"seed": 2}}, 400, None, "seed"),
        ({"engine": "sine", "text": "x", "colour": "red"}, 400, "invalid_request", "colour"),
        (
            {"engine": "faulty", "text": "x", "params": {"fault": "crash", "at": 0}},
            500,
            "engine_error",
            None,
        ),
    ],
)
def test_a_refused_synthesis_is_a_typed_json_error_with_its_status(
    server: RunningServer,
    body: dict[str, object],
    status: int,
    code: str | None,
    field: str | None,
) -> None:
    answer = server.client.post("/api/v1/synthesize", json=body)
    assert answer.status_code == status, answer.text
    error = answer.json()
    assert set(error) == {"code", "message", "detail"} and error["code"] in ERROR_CODES
    assert error["code"] == (code or "invalid_request")
    if field is not None:
        assert error["detail"]["field"] == field, error
    assert "traceback" not in error["detail"]


@pytest.mark.parametrize(
    "content_type",
    [
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "text/plain;charset=UTF-8",
        None,  # fetch(url, {method: "POST", mode: "no-cors", body: blob}) sends no type
    ],
    ids=["form", "multipart", "text", "untyped"],
)
def test_what_a_page_elsewhere_can_send_is_never_acted_on(
    server: RunningServer, tmp_path: Path, content_type: str | None
) -> None:
    """A form or a no-cors fetch on any web page reaches a loopback server without asking it
    first, but only with these types: every route that changes something refuses them (415)."""
    log = tmp_path / "witness.log"
    synthesis = {"engine": "witness", "text": "x", "params": {"log": str(log)}}
    headers = {} if content_type is None else {"content-type": content_type}
    requests: list[tuple[str, dict[str, str], bytes]] = [
        ("/api/v1/voices", {"engine": "faulty", "name": "cross-site"}, wav_recording()),
        ("/api/v1/synthesize", {}, json.dumps(synthesis).encode()),
        ("/api/v1/runtime/load", {}, b'{"engine": "witness"}'),
        ("/api/v1/runtime/unload", {}, b'{"model": null}'),
    ]
    for path, params, body in requests:
        answer = server.client.post(path, params=params, content=body, headers=headers)
        assert answer.status_code == 415, f"{path}: {answer.text}"
        assert answer.json()["code"] == "unsupported_media_type"
        assert answer.json()["detail"]["field"] == "content-type"
    assert not log.exists(), "the synthesis ran"
    assert not (server.home / "voices" / "faulty" / "cross-site").exists(), "the voice was made"


def test_a_request_from_another_origin_is_refused(server: RunningServer, tmp_path: Path) -> None:
    """A browser names the page that sends a request in ``Origin``: only the server's own may
    make it act; programs, which send no Origin, are not concerned."""
    log = tmp_path / "witness.log"
    body = {"engine": "witness", "text": "x", "params": {"log": str(log)}}
    for origin in ("http://attacker.example", "null", "http://127.0.0.1:1"):
        answer = server.client.post("/api/v1/synthesize", json=body, headers={"origin": origin})
        assert answer.status_code == 403, f"{origin}: {answer.text}"
        assert answer.json()["code"] == "forbidden"
        assert answer.json()["detail"] == {"field": "origin", "origin": origin}
    assert not log.exists(), "the synthesis ran"
    own = server.client.post("/api/v1/synthesize", json=body, headers={"origin": server.url})
    assert own.status_code == 200, own.text
    assert chunks_computed(log) == 4


def test_a_client_that_reads_nothing_holds_the_engine_back(
    server: RunningServer, tmp_path: Path
) -> None:
    """The engine computes a chunk only when fewer than AHEAD wait for the client: one that
    reads nothing costs the socket's buffers and AHEAD chunks, never the whole synthesis."""
    log = tmp_path / "witness.log"
    chunks = 400  # of 128 KiB each over HTTP: 50 MiB, far more than the sockets' buffers hold
    params = {"log": str(log), "chunks": chunks, "chunk_samples": 65536}
    body = {"engine": "witness", "text": "x", "params": params}
    with server.client.stream("POST", "/api/v1/synthesize", json=body) as answer:
        assert answer.status_code == 200
        outcome = f"/api/v1/requests/{answer.headers['x-mizuoto-request']}"
        assert wait_for(lambda: server.client.get(outcome).json()["waiting_for_client"], 60)
        computed = chunks_computed(log)  # before the count of chunks taken, which only grows
        taken = server.client.get(outcome).json()["chunks"]
        assert computed <= taken + AHEAD, (computed, taken)
        assert computed < chunks
    assert wait_for(lambda: "finally" in log.read_text(), 30), "leaving did not stop the engine"


def test_a_failure_after_the_first_chunk_cuts_the_stream_and_the_server_goes_on(
    server: RunningServer,
) -> None:
    params = {"fault": "crash", "at": 2, "chunks": 4}
    body = {"engine": "faulty", "text": "x", "seed": 1, "params": params}
    with (
        server.client.stream("POST", "/api/v1/synthesize", json=body) as answer,
        pytest.raises(httpx.RemoteProtocolError),
    ):
        request_id = answer.headers["x-mizuoto-request"]
        answer.read()  # two chunks came, then the body ended without its last chunk
    outcome = server.client.get(f"/api/v1/requests/{request_id}").json()
    assert (outcome["state"], outcome["chunks"]) == ("failed", 2)
    assert outcome["error"]["code"] == "engine_error"
    assert "crashed on purpose" in outcome["error"]["message"]
    assert "traceback" not in outcome["error"]["detail"]
    assert "synthesis failed after 2 chunks [engine_error]" in server.log_text()
    assert server.client.get("/api/v1/requests/0123").json()["code"] == "not_found"


def test_how_each_synthesis_ended_is_kept_under_its_id(server: RunningServer) -> None:
    done = server.client.post("/api/v1/synthesize", json={"engine": "sine", "text": "a b c"})
    outcome = server.client.get(f"/api/v1/requests/{done.headers['x-mizuoto-request']}").json()
    assert outcome["state"] == "done" and outcome["error"] is None
    assert outcome["model"] == done.headers["x-mizuoto-model"] and outcome["chunks"] >= 1
    body = {"engine": "faulty", "text": "x", "seed": 1, "params": HANG_AFTER_FIRST}
    with server.client.stream("POST", "/api/v1/synthesize", json=body) as answer:
        request_id = answer.headers["x-mizuoto-request"]
        received = answer.iter_raw()  # held: dropped, it closes the connection when collected
        next(received)
        streaming = server.client.get(f"/api/v1/requests/{request_id}").json()
        assert streaming["state"] == "streaming"
    assert wait_for(
        lambda: server.client.get(f"/api/v1/requests/{request_id}").json()["state"] == "cancelled"
    )
    assert wait_for(lambda: model_state(server, "faulty") == ["idle"]), "the engine went on"


def test_unknown_paths_and_methods_answer_in_the_error_shape(server: RunningServer) -> None:
    missing = server.client.get("/api/v1/nothing")
    assert (missing.status_code, missing.json()["code"]) == (404, "not_found")
    wrong = server.client.get("/api/v1/synthesize")
    assert (wrong.status_code, wrong.json()["code"]) == (405, "method_not_allowed")


def test_load_lists_unload_removes_and_an_unknown_name_is_refused(server: RunningServer) -> None:
    loaded = server.client.post("/api/v1/runtime/load", json={"engine": "faulty"})
    assert loaded.status_code == 200, loaded.text
    name = loaded.json()["model"]
    models = server.client.get("/api/v1/runtime").json()["models"]
    assert [m["engine"] for m in models if m["name"] == name] == ["faulty"]
    # a cancelled call of an earlier test may still be ending: unload takes idle models only
    assert wait_for(lambda: model_state(server, "faulty") == ["idle"])
    unloaded = server.client.post("/api/v1/runtime/unload", json={"model": name})
    assert unloaded.json() == {"unloaded": [name]}
    models = server.client.get("/api/v1/runtime").json()["models"]
    assert name not in [m["name"] for m in models]
    unknown = server.client.post("/api/v1/runtime/unload", json={"model": "nope/x@cpu"})
    assert unknown.status_code == 400 and unknown.json()["detail"]["field"] == "model"


def test_every_spelling_of_the_cpu_loads_one_model_and_a_bad_device_is_named(
    server: RunningServer,
) -> None:
    names = set()
    for device in ("cpu", "cpu:0", "cpu:7", "cpu:01"):  # a 500, a 503 and three copies before
        loaded = server.client.post(
            "/api/v1/runtime/load", json={"engine": "faulty", "device": device}
        )
        assert loaded.status_code == 200, loaded.text
        names.add(loaded.json()["model"])
    assert len(names) == 1
    models = server.client.get("/api/v1/runtime").json()["models"]
    assert [m["name"] for m in models if m["engine"] == "faulty"] == list(names)
    for device in ("cpu:x", "gpu", "cuda:-1"):
        refused = server.client.post(
            "/api/v1/runtime/load", json={"engine": "faulty", "device": device}
        )
        assert refused.status_code == 400, refused.text
        assert refused.json()["code"] == "invalid_request"
        assert refused.json()["detail"]["field"] == "device"


def test_a_busy_model_is_not_unloaded_until_its_call_ends(server: RunningServer) -> None:
    body = {"engine": "faulty", "text": "x", "seed": 1, "params": HANG_AFTER_FIRST}
    with server.client.stream("POST", "/api/v1/synthesize", json=body) as answer:
        received = answer.iter_raw()  # held: dropped, it closes the connection when collected
        next(received)
        assert server.client.post("/api/v1/runtime/unload", json={"model": None}).status_code == 200
        assert model_state(server, "faulty") == ["busy"]
    assert wait_for(lambda: model_state(server, "faulty") in ([], ["idle"]))


def test_a_voice_prepared_over_http_is_used_by_a_synthesis(server: RunningServer) -> None:
    recording = io.BytesIO()
    tone = 0.3 * np.sin(np.arange(24000) * 2 * np.pi * 220 / 24000).astype(np.float32)
    write_wav(recording, tone, 24000)
    answer = server.client.post(
        "/api/v1/voices",
        params={"engine": "codeclm", "name": "tone-220", "seed": 3},
        content=recording.getvalue(),
        headers={"content-type": "audio/wav"},
    )
    assert answer.status_code == 200, answer.text
    voice = answer.json()["voice"]
    assert voice == "codeclm/tone-220"  # inside the voices folder; its path is never shown
    assert (server.home / "voices" / "codeclm" / "tone-220").is_dir()
    with_voice = {"engine": "codeclm", "text": "hi", "seed": 3, "params": {"voice": voice}}
    without = {"engine": "codeclm", "text": "hi", "seed": 3}
    spoken = server.client.post("/api/v1/synthesize", json=with_voice)
    plain = server.client.post("/api/v1/synthesize", json=without)
    assert spoken.status_code == plain.status_code == 200, spoken.text
    assert pcm_of(spoken.content)[1] != pcm_of(plain.content)[1]
    again = server.client.post(
        "/api/v1/voices",
        params={"engine": "codeclm", "name": "tone-220"},
        content=recording.getvalue(),
        headers={"content-type": "audio/wav"},
    )
    assert again.status_code == 400 and again.json()["detail"]["field"] == "voice_dir"
    assert "<data folder>/voices/codeclm/tone-220" in again.json()["message"]
    answers = [answer, again, spoken, plain]
    answers += [server.client.get(path) for path in ("/api/v1/runtime", "/api/v1/runtime/doctor")]
    for each in answers:
        assert str(server.home) not in each.text, each.request.url


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"params": {"chunks": 0}}, "invalid_request", "params.chunks"),
        ({"params": {"chunk": 2}}, "invalid_request", "params.chunk"),
        ({"model": "nope"}, "invalid_request", "model"),
    ],
    ids=["bad-value", "unknown-param", "unknown-model"],
)
def test_a_refused_synthesis_loads_no_model(
    server: RunningServer, body: dict[str, object], code: str, field: str
) -> None:
    answer = server.client.post(
        "/api/v1/synthesize", json={"engine": "ranked", "text": "x", **body}
    )
    assert answer.status_code == 400, answer.text
    assert (answer.json()["code"], answer.json()["detail"]["field"]) == (code, field)
    assert model_state(server, "ranked") == []  # no other test of the server loads ranked


def test_a_refused_voice_upload_loads_no_model(server: RunningServer) -> None:
    answer = server.client.post(
        "/api/v1/voices",
        params={"engine": "ranked", "name": "me"},  # ranked does not prepare voices
        content=wav_recording(),
        headers={"content-type": "audio/wav"},
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "capability_not_supported"
    assert model_state(server, "ranked") == []


@pytest.mark.parametrize(
    ("name", "content", "field"),
    [("../up", None, "name"), (".hidden", None, "name"), ("ok", b"not a wav", "audio")],
)
def test_a_bad_voice_upload_names_what_is_wrong(
    server: RunningServer, name: str, content: bytes | None, field: str
) -> None:
    recording = io.BytesIO()
    write_wav(recording, np.zeros(1600, dtype=np.float32), 16000)
    answer = server.client.post(
        "/api/v1/voices",
        params={"engine": "faulty", "name": name},
        content=content if content is not None else recording.getvalue(),
        headers={"content-type": "audio/wav"},
    )
    assert answer.status_code == 400 and answer.json()["detail"]["field"] == field, answer.text
    assert not (server.home / "voices" / "faulty" / name).exists()


def test_the_openapi_description_lists_the_api(server: RunningServer) -> None:
    paths = server.client.get("/openapi.json").json()["paths"]
    for path in ("/api/v1/synthesize", "/api/v1/runtime", "/api/v1/runtime/unload"):
        assert path in paths


def test_only_loopback_host_names_are_answered(server: RunningServer) -> None:
    """A name rebound to 127.0.0.1 by a page elsewhere must not reach a loopback server."""
    rebound = server.client.get("/api/v1/health", headers={"host": "attacker.example"})
    assert rebound.status_code == 400 and rebound.json()["detail"]["field"] == "host"
    named = server.client.get(
        "/api/v1/health", headers={"host": f"localhost:{server.record['port']}"}
    )
    assert named.status_code == 200


def test_a_failure_no_handler_expected_still_answers_in_the_error_shape(tmp_path) -> None:
    from starlette.testclient import TestClient

    from mizuoto_sdk.server.app import create_app

    with RuntimeService() as service:
        service.describe_engines = lambda: 1 / 0  # type: ignore[method-assign]  # a bug, on purpose
        app = create_app(service, home=tmp_path)
        with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
            answer = client.get("/api/v1/engines")
    assert answer.status_code == 500
    assert answer.json()["code"] == "engine_error"
    assert "ZeroDivisionError" in answer.json()["message"]


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_recording_past_the_limit_is_refused_before_it_is_read_whole(
    tmp_path, monkeypatch: pytest.MonkeyPatch, declared: bool
) -> None:
    from starlette.testclient import TestClient

    from mizuoto_sdk.server import app as server_app

    monkeypatch.setattr(server_app, "MAX_RECORDING", 1000)
    data = b"RIFF" + bytes(4000)
    content = data if declared else iter([data[:1500], data[1500:]])
    with RuntimeService() as service:
        app = server_app.create_app(service, home=tmp_path)
        with TestClient(app, base_url="http://127.0.0.1") as client:
            answer = client.post(
                "/api/v1/voices",
                params={"engine": "sine", "name": "long"},
                content=content,
                headers={"content-type": "audio/wav"},
            )
    assert answer.status_code == 400, answer.text
    assert answer.json()["detail"] == {"field": "audio", "limit_bytes": 1000}
    assert not (tmp_path / "voices").exists()
