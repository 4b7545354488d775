"""The agent over a raw socket on 127.0.0.1: the hello and its refusals, frame limits, files by
content, a synthesize equal to the in-process one, heartbeats and prepare_voice's files; the file
cache on its own; and the frame decoder fuzzed."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from serving_support import SITE, faulty_service, wait_until

from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.frames import KINDS, Frame, FrameError, chunk_from_frame, decode, encode
from mizuoto_sdk.host.agent import HELLO_LIMIT, Agent
from mizuoto_sdk.remote.cache import FileCache
from mizuoto_sdk.remote.files import (
    file_ref,
    format_ref,
    put_frames,
    relative_path,
    upload_for,
)
from mizuoto_sdk.remote.wire import PROTOCOL, ConnectionClosed, FrameSocket
from mizuoto_sdk.request import EngineRequest

TOKEN = b"a long random secret for the tests"
SEED = 4242


@contextlib.contextmanager
def running_agent(files: Path, **options: Any) -> Iterator[Agent]:
    """An agent of the faulty engine serving on a thread of this process, until the block ends."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(SITE))
        service = faulty_service()
        server = Agent(service, TOKEN, files=files, devices=["cpu"], **options)
        server.serve("127.0.0.1", 0)
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        try:
            yield server
        finally:
            server.shutdown()
            thread.join(10)
            service.close()


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    files = tmp_path_factory.mktemp("agent") / "files"
    with running_agent(files, heartbeat_interval=0.2, hello_timeout=2.0) as server:
        yield server


def connect(agent: Agent) -> FrameSocket:
    sock = socket.create_connection(agent.bound_address, timeout=10)
    return FrameSocket(sock)


def hello(
    agent: Agent, token: bytes = TOKEN, protocol: int = PROTOCOL
) -> tuple[FrameSocket, Frame]:
    peer = connect(agent)
    peer.send("hello", {"protocol": protocol, "token": token.decode(), "version": "test"})
    return peer, receive(peer)


def receive(peer: FrameSocket, skip: tuple[str, ...] = ("heartbeat",)) -> Frame:
    while True:
        frame = peer.receive()
        if frame.kind not in skip:
            return frame


def session(agent: Agent) -> FrameSocket:
    """A connection with the faulty engine open and its model loaded."""
    peer, ready = hello(agent)
    assert ready.kind == "ready", ready
    peer.send("open", {"engine": "faulty", "device": "cpu"})
    assert receive(peer).kind == "result"
    peer.send("load", {"model": None, "dtype": None, "variant": None, "options": {}})
    loaded = receive(peer)
    assert loaded.kind == "result" and loaded.header["device"] == "cpu", loaded
    return peer


def assert_closed(peer: FrameSocket) -> None:
    with pytest.raises((ConnectionClosed, ConnectionResetError)):
        receive(peer, skip=("heartbeat", "refused"))


def test_the_right_token_gets_the_agents_info(agent: Agent) -> None:
    peer, ready = hello(agent)
    assert ready.kind == "ready"
    assert ready.header["protocol"] == PROTOCOL
    assert "faulty" in ready.header["engines"]
    assert ready.header["models"]["faulty"] == ["default"]
    assert ready.header["devices"] == ["cpu"]
    peer.close()


def test_a_wrong_token_is_refused_and_nothing_else_is_read(agent: Agent) -> None:
    peer = connect(agent)
    # the hello, then a request the agent must never answer
    data = encode("hello", {"protocol": PROTOCOL, "token": "guess", "version": "x"})
    peer.socket.sendall(data + encode("status", {}))
    refused = peer.receive()
    assert refused.kind == "refused"
    assert refused.header["code"] == "engine_unavailable"
    assert refused.header["detail"]["reason"] == "token"
    assert_closed(peer)


def test_another_protocol_is_refused_with_the_fix(agent: Agent) -> None:
    peer, refused = hello(agent, protocol=PROTOCOL + 1)
    assert refused.kind == "refused"
    assert refused.header["detail"]["reason"] == "protocol"
    assert refused.header["detail"]["protocol"] == PROTOCOL
    assert "install the same Mizuoto version on both machines" in refused.header["message"]
    assert_closed(peer)


def test_an_oversized_hello_is_refused_before_its_body_is_read(agent: Agent) -> None:
    peer = connect(agent)
    peer.socket.sendall(struct.pack(">I", HELLO_LIMIT + 1))  # a length, and no body at all
    refused = peer.receive()
    assert refused.kind == "refused" and refused.header["detail"]["reason"] == "frame"
    assert_closed(peer)


def test_an_oversized_frame_ends_a_session(agent: Agent) -> None:
    peer = session(agent)
    peer.socket.sendall(struct.pack(">I", agent.frame_limit + 1))
    refused = receive(peer)
    assert refused.kind == "refused" and refused.header["detail"]["reason"] == "frame"
    assert_closed(peer)


def test_a_file_with_a_wrong_hash_is_refused_and_not_kept(agent: Agent, tmp_path: Path) -> None:
    peer = session(agent)
    claimed = hashlib.sha256(b"what the host says").hexdigest()
    for header, data in put_frames({"sha256": claimed, "name": "v.wav", "size": 9}, b"something"):
        peer.send("put", header, data)
    error = receive(peer)
    assert error.kind == "error" and error.header["code"] == "invalid_request"
    assert error.header["detail"]["reason"] == "hash_mismatch"
    peer.send("have", {"files": [{"sha256": claimed, "name": "v.wav", "size": 9}]})
    assert receive(peer).header["missing"] == [claimed]
    assert not list(agent.files.root.rglob("*v.wav*"))
    assert not any(p.is_file() for p in (agent.files.root / ".partial").glob("*"))
    peer.close()


def test_have_put_and_resolve_a_file(agent: Agent, tmp_path: Path) -> None:
    voice = tmp_path / "voice.wav"
    voice.write_bytes(os.urandom(3000))
    upload = upload_for(voice)
    peer = session(agent)
    refs = [ref for ref, _ in upload.files]
    peer.send("have", {"files": refs})
    assert receive(peer).header["missing"] == [refs[0]["sha256"]]
    for ref, source in upload.files:
        for header, data in put_frames(ref, source, chunk=1024):  # three pieces
            peer.send("put", header, data)
        assert receive(peer).kind == "result"
    peer.send("have", {"files": refs})
    assert receive(peer).header["missing"] == []
    cached = agent.files.path(upload.value)
    assert cached.read_bytes() == voice.read_bytes() and cached.name == "voice.wav"
    peer.close()


def test_a_folder_travels_as_its_manifest_and_files(tmp_path: Path) -> None:
    folder = tmp_path / "alice"
    (folder / "sub").mkdir(parents=True)
    (folder / "voice.json").write_text('{"a": 1}')
    (folder / "sub" / "embedding.bin").write_bytes(b"\x00\x01\x02")
    upload = upload_for(folder)
    cache = FileCache(tmp_path / "cache")
    assert cache.have([ref for ref, _ in upload.files]) == [
        str(ref["sha256"]) for ref, _ in upload.files
    ]
    for ref, source in upload.files:
        for header, data in put_frames(ref, source):
            cache.put(data=data, **header)  # type: ignore[arg-type]  # the header's fields
    rebuilt = cache.path(upload.value)
    assert rebuilt.name == "alice"
    assert (rebuilt / "voice.json").read_text() == '{"a": 1}'
    assert (rebuilt / "sub" / "embedding.bin").read_bytes() == b"\x00\x01\x02"
    assert upload_for(rebuilt).value == upload.value


def test_the_cache_refuses_what_it_was_not_sent(tmp_path: Path) -> None:
    cache = FileCache(tmp_path)
    missing = format_ref("0" * 64, "v.wav")
    with pytest.raises(InvalidRequest) as caught:
        cache.path(missing, "params.voice")
    assert caught.value.detail["reason"] == "file_missing"
    for bad in ("mizuoto-file:../../etc/passwd", "mizuoto-file:" + "a" * 64 + "/../x", "/etc"):
        with pytest.raises(InvalidRequest):
            cache.path(bad)
    with pytest.raises(InvalidRequest):
        relative_path("../outside", "name")
    with pytest.raises(InvalidRequest) as caught:  # a piece that skips ahead
        cache.put("a" * 64, "v.wav", 5, 10, False, b"12345")
    assert caught.value.detail["reason"] == "offset"


def test_collect_deletes_old_files_only(tmp_path: Path) -> None:
    cache = FileCache(tmp_path)
    old, new = tmp_path / "old.bin", tmp_path / "new.bin"
    old.write_bytes(b"old")
    new.write_bytes(b"new")
    for path in (old, new):
        ref = file_ref(path)
        cache.put(str(ref["sha256"]), path.name, 0, int(ref["size"]), True, path.read_bytes())  # type: ignore[call-overload]  # an int
    now = time.time()
    old_sha = str(file_ref(old)["sha256"])
    os.utime(tmp_path / old_sha, (now - 31 * 86400, now - 31 * 86400))
    assert cache.collect(now) == [old_sha]
    assert cache.path(format_ref(str(file_ref(new)["sha256"]), "new.bin")).read_bytes() == b"new"
    with pytest.raises(InvalidRequest):
        cache.path(format_ref(old_sha, "old.bin"))


def test_synthesize_over_the_socket_equals_in_process(agent: Agent) -> None:
    params = {"seed": SEED, "chunks": 3, "chunk_samples": 800}
    local = agent.service.load("faulty")
    expected = [c.samples for c in local.synthesize("hi", EngineRequest(params=dict(params)))]
    peer = session(agent)
    peer.send("request", {"id": 1, "capability": "synthesize", "text": "hi", "params": params})
    assert receive(peer).kind == "started"
    received = []
    while (frame := receive(peer)).kind == "chunk":
        received.append(chunk_from_frame(frame).samples)
        peer.send("next", {"id": 1})
    assert frame.kind == "end" and frame.header["applied"] is not None, frame
    assert len(received) == 3
    assert all(np.array_equal(a, b) for a, b in zip(received, expected, strict=True))
    peer.close()


def test_heartbeats_arrive_while_a_session_is_quiet(agent: Agent) -> None:
    peer = session(agent)
    started = time.monotonic()
    beats = [receive(peer, skip=()) for _ in range(3)]
    assert [b.kind for b in beats] == ["heartbeat"] * 3
    assert time.monotonic() - started < 3.0  # at 0.2 s, not the default 5 s
    peer.close()


def test_prepare_voice_sends_its_folder_back_as_files(agent: Agent) -> None:
    peer = session(agent)
    audio = {"sample_rate": 16_000, "shape": [160], "metadata": {}}
    payload = np.zeros(160, dtype="<f4").tobytes()
    header = {"id": 7, "capability": "prepare_voice", "audio": audio, "params": {}}
    peer.send("request", header, payload)
    assert receive(peer).kind == "started"
    file = receive(peer)
    assert file.kind == "file", file
    assert (file.header["id"], file.header["name"], file.header["offset"]) == (7, "voice.json", 0)
    assert json.loads(file.payload) == {"samples": 160}
    assert file.header["size"] == len(file.payload)
    result = receive(peer)
    assert result.kind == "result" and result.header["value"] == {"samples": 160}
    assert not any("voice_dir" in str(v) for v in result.header.values())
    peer.close()


def test_a_request_whose_params_are_no_object_gets_its_error(agent: Agent) -> None:
    peer = session(agent)
    header = {"id": 3, "capability": "call", "op": "echo", "arguments": {}, "params": []}
    peer.send("request", header)
    error = receive(peer)
    assert error.kind == "error" and error.header["id"] == 3
    assert error.header["detail"]["field"] == "params"
    peer.close()


# The decoder sees bytes from peers: whatever they hold, only FrameError comes out.
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_decode_random_bytes_raises_only_frame_errors(data: bytes) -> None:
    with contextlib.suppress(FrameError):
        decode(data)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(sorted(KINDS)),
    header=st.dictionaries(st.text(max_size=8), _json, max_size=4),
    payload=st.binary(max_size=32),
    cut=st.integers(min_value=-8, max_value=64),
    size=st.none() | st.integers(min_value=0, max_value=2**32 - 1),
    number=st.none() | st.integers(min_value=0, max_value=255),
)
def test_decode_damaged_frames_raises_only_frame_errors(
    kind: str,
    header: dict[str, object],
    payload: bytes,
    cut: int,
    size: int | None,
    number: int | None,
) -> None:
    data = bytearray(encode(kind, header, payload))
    if size is not None:
        data[:4] = struct.pack(">I", size)
    if number is not None:
        data[4] = number
    damaged = bytes(data[:cut] if cut > 0 else data)
    try:
        frame = decode(damaged)
    except FrameError:
        return
    assert isinstance(frame.header, dict)


# -- nothing a host sends, and nothing a host leaves, outlives its session ---------------------


@pytest.fixture
def thread_failures(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Exceptions that end a thread of this process, as ``threading.excepthook`` sees them."""
    failures: list[str] = []
    monkeypatch.setattr(
        threading, "excepthook", lambda hook: failures.append(f"{hook.exc_type.__name__}")
    )
    return failures


def test_a_hello_nested_deep_is_refused_as_malformed(
    agent: Agent, thread_failures: list[str]
) -> None:
    # What a user saw: a RecursionError traceback in the agent's log, and a connection dropped.
    peer = connect(agent)
    deep = b'{"token":' + b"[" * 20_000 + b"]" * 20_000 + b"}"
    assert len(deep) < HELLO_LIMIT
    peer.socket.sendall(struct.pack(">IBI", 5 + len(deep), KINDS["hello"], len(deep)) + deep)
    refused = receive(peer)
    assert refused.kind == "refused", refused
    assert refused.header["code"] == "invalid_request"
    assert refused.header["detail"]["reason"] == "frame"
    assert "deeper than" in refused.header["message"]
    assert_closed(peer)
    assert thread_failures == []


def test_a_hello_trickled_a_byte_at_a_time_is_refused_at_its_deadline(tmp_path: Path) -> None:
    # What a user saw: the hello timeout counted per read, so a byte every few seconds kept a
    # connection without a token open for ever. Now the whole hello has hello_timeout seconds.
    with running_agent(tmp_path, hello_timeout=1.0) as slow:
        peer = connect(slow)
        data = encode("hello", {"protocol": PROTOCOL, "token": TOKEN.decode(), "version": "x"})
        sent = 0
        # a byte every 0.25 s, each gap well inside the 1 s timeout; the agent answers first
        while sent < len(data) and not select.select([peer.socket], [], [], 0.25)[0]:
            peer.socket.sendall(data[sent : sent + 1])
            sent += 1
        assert sent < len(data), "the whole hello went through, a byte at a time"
        refused = receive(peer)
        assert refused.kind == "refused" and refused.header["detail"]["reason"] == "timeout"
        assert_closed(peer)


def test_frames_with_fields_of_the_wrong_type_get_errors_naming_them(
    agent: Agent, thread_failures: list[str]
) -> None:
    # What a user saw: a frame whose id was a list killed the session's thread (TypeError).
    peer = session(agent)
    cases = [
        ("next", {"id": [1]}, "id"),
        ("cancel", {"id": {"a": 1}}, "id"),
        ("request", {"id": [1], "capability": "call", "op": "echo"}, "id"),
        ("request", {"capability": "call", "op": "echo"}, "id"),
        ("request", {"id": 5, "capability": ["call"]}, "capability"),
        ("request", {"id": 6, "capability": "call", "op": 3}, "op"),
        ("request", {"id": 7, "capability": "synthesize", "text": None}, "text"),
        ("request", {"id": 8, "capability": "convert", "audio": [1]}, "audio"),
        ("request", {"id": 9, "capability": "call", "op": "echo", "timeout": "soon"}, "timeout"),
        ("text", {"id": 1, "text": 5}, "text"),
        ("status", {"id": "x"}, "id"),
    ]
    for kind, header, field in cases:
        peer.send(kind, header)
        error = receive(peer)
        assert (error.kind, error.header["code"]) == ("error", "invalid_request"), (kind, error)
        assert error.header["detail"]["field"] == field, (kind, header, error.header)
    # a frame that is not JSON inside a right length: answered, and the session goes on
    body = b"{not json"
    peer.socket.sendall(struct.pack(">IBI", 5 + len(body), KINDS["status"], len(body)) + body)
    error = receive(peer)
    assert error.kind == "error" and error.header["detail"]["field"] == "frame"
    peer.send("request", {"id": 10, "capability": "call", "op": "echo", "arguments": {"a": 1}})
    assert receive(peer, skip=("heartbeat", "started")).header["value"] == {"a": 1}
    peer.close()
    assert thread_failures == []


_FIELDS = ("id", "capability", "op", "text", "audio", "params", "timeout", "arguments", "of")
_FIELDS += ("files", "sha256", "name", "offset", "size", "final", "engine", "device", "model")
_VALUE = st.recursive(  # strings from a small alphabet: never a fault's name (exit, hang)
    st.none()
    | st.booleans()
    | st.integers(-3, 2**40)
    | st.floats()
    | st.text("ab01-/.", max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("ab", max_size=2), inner),
    max_leaves=6,
)
_HOST_KINDS = ("request", "next", "cancel", "close", "text", "have", "put", "status", "hello")


@settings(max_examples=100, deadline=None)
@given(
    kind=st.sampled_from(_HOST_KINDS),
    header=st.fixed_dictionaries(
        {"id": _VALUE}, optional={field: _VALUE for field in _FIELDS if field != "id"}
    ),
    payload=st.binary(max_size=16),
)
def test_any_frame_a_host_sends_leaves_the_session_answering(
    agent: Agent, kind: str, header: dict[str, object], payload: bytes
) -> None:
    peer = session(agent)
    body = json.dumps(header).encode()  # NaN and Infinity too, as Python's JSON reads them
    try:
        frame = struct.pack(">IBI", 5 + len(body) + len(payload), KINDS[kind], len(body))
        peer.socket.sendall(frame + body + payload)
        peer.send("status", {"id": 4242})
        while (frame := receive(peer)).header.get("id") != 4242:
            pass
        assert frame.kind == "result", frame
    finally:
        peer.close()


def test_threads_come_back_to_their_baseline_after_many_sessions(tmp_path: Path) -> None:
    # What a user saw: one request thread kept per session ended (6 -> 24 -> 44 -> 64 threads).
    baseline = threading.active_count()
    with running_agent(tmp_path, heartbeat_interval=0.2) as busy:
        for index in range(12):
            peer = session(busy)
            call = {"id": 1, "capability": "call", "op": "echo", "arguments": {"n": index}}
            peer.send("request", call)
            assert receive(peer, skip=("heartbeat", "started")).header["value"] == {"n": index}
            peer.close()
        # the accept loop and the one request thread kept for the next session's requests
        kept = baseline + 2
        wait_until(lambda: threading.active_count() <= kept, 30, f"{kept} threads or fewer")
