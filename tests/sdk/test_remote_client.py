"""The host's side of remote engines: a handle on an agent in another process on 127.0.0.1
answers as a local model does (the same bytes for a seed, cancel and timeout, prepare_voice's
folder), a lost agent or a silent one fails requests with worker_failed and the next request
connects again, wrong tokens and protocols are refused clearly; the wire, settings and plan on
their own."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from serving_support import SITE, faulty_service

from mizuoto_sdk.discovery import Discovery
from mizuoto_sdk.errors import (
    CancelledError,
    EngineUnavailable,
    InvalidRequest,
    OperationTimeoutError,
    WorkerFailed,
)
from mizuoto_sdk.frames import FrameError, encode
from mizuoto_sdk.host import RuntimeService
from mizuoto_sdk.host.settings import Settings
from mizuoto_sdk.remote import client, handshake
from mizuoto_sdk.remote.wire import ConnectionClosed, FrameSocket
from mizuoto_sdk.request import EngineRequest
from mizuoto_sdk.serving import exchange
from mizuoto_sdk.serving.plan import plan_deployment

HERE = Path(__file__).parent
TOKEN = "another long random secret for the tests"


class AgentProcess:
    def __init__(self, folder: Path) -> None:
        self.token_file = folder / "token"
        self.token_file.write_text(TOKEN + "\n")
        script = str(HERE / "remote_agent_proc.py")
        command = [sys.executable, script, str(self.token_file), str(folder / "files")]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"the agent process exited with {self.process.wait()}"
        self.port, self.silent_port = (int(p) for p in line.split())

    def settings(self, engine: str, *, silent: bool = False, **extra: object) -> dict[str, Any]:
        port = self.silent_port if silent else self.port
        return {
            f"engines.{engine}.device": "box/cpu",
            "remote.hosts.box.address": f"127.0.0.1:{port}",
            "remote.hosts.box.token_file": str(self.token_file),
            **extra,
        }

    def stop(self) -> None:
        """Close its stdin (it stops), wait, kill if it must; its pipes are closed either way."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    process = AgentProcess(tmp_path_factory.mktemp("agent"))
    yield process
    process.stop()


@pytest.fixture
def site(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SITE))  # the faulty engine, for local runs


def service(settings: dict[str, Any]) -> RuntimeService:
    """A host that knows the faulty fixture engine and the bundled ones."""
    return RuntimeService(settings, Discovery(path=[str(SITE), *sys.path], selection=None))


def collect(chunks: Iterator[Any]) -> bytes:
    return b"".join(np.asarray(c.samples, dtype="<f4").tobytes() for c in chunks)


# -- through an agent process -----------------------------------------------------------------


def test_sine_through_the_agent_equals_local_audio_bitwise(agent: AgentProcess) -> None:
    with RuntimeService() as local:
        expected = collect(
            local.load("sine").synthesize("hello", EngineRequest(params={"seed": 7}))
        )
    with service(agent.settings("sine")) as host:
        model = host.load("sine")
        assert model.mode == "remote"
        request = EngineRequest(params={"seed": 7})
        assert collect(model.synthesize("hello", request)) == expected
        assert request.timings  # written back from the agent


def test_many_threads_on_one_session_get_what_one_local_caller_gets(
    agent: AgentProcess, site: None
) -> None:
    # 6 threads stream at once over one connection to the agent; each stream equals the same
    # seed's stream from one local caller asking in turn.
    def ask(model: Any, seed: int) -> bytes:
        params = {"seed": seed, "chunks": 3, "chunk_samples": 400}
        return collect(model.synthesize(f"text {seed}", EngineRequest(params=params)))

    seeds = list(range(200, 218))
    with service({}) as local:
        serial = {seed: ask(local.load("faulty"), seed) for seed in seeds}
    with service(agent.settings("faulty")) as host:
        model = host.load("faulty")
        start = threading.Barrier(6)

        def client(mine: list[int]) -> dict[int, bytes]:
            start.wait()
            return {seed: ask(model, seed) for seed in mine}

        with ThreadPoolExecutor(6) as pool:
            parts = list(pool.map(client, [seeds[i::6] for i in range(6)]))
        assert [r.in_flight for r in model.replicas] == [0]
    assert {seed: answer for part in parts for seed, answer in part.items()} == serial


def test_faulty_through_the_agent_equals_local_and_writes_back(
    agent: AgentProcess, site: None
) -> None:
    params = {"chunks": 3, "chunk_samples": 800}
    with faulty_service() as local:
        expected = collect(
            local.load("faulty").synthesize("x", EngineRequest(params={"seed": 11, **params}))
        )
    with service(agent.settings("faulty")) as host:
        model = host.load("faulty")
        request = EngineRequest(params={"seed": 11, **params})
        assert collect(model.synthesize("x", request)) == expected
        assert request.applied  # written back from the agent
        rows = host.describe_models()
        assert [(r["mode"], r["host"], r["device"]) for r in rows] == [("remote", "box", "box/cpu")]
        assert model.call("echo", {"a": [1, 2]}) == {"a": [1, 2]}


def test_cancel_and_timeout_cross_the_wire(agent: AgentProcess) -> None:
    hang = {"fault": "hang_cancellable", "at": 1}
    with service(agent.settings("faulty")) as host:
        model = host.load("faulty")
        request = EngineRequest(params={"seed": 1, **hang})
        stream = model.synthesize("x", request)
        next(stream)  # chunk 0; the engine now waits at chunk 1 until cancelled
        threading.Timer(0.2, request.cancel).start()
        with pytest.raises(CancelledError):
            next(stream)
        with pytest.raises(OperationTimeoutError):
            collect(model.synthesize("x", EngineRequest(params={"seed": 2, **hang}, timeout=0.5)))
        assert model.call("echo", {"after": True}) == {"after": True}  # the session goes on


def test_prepare_voice_brings_its_folder_back(agent: AgentProcess, tmp_path: Path) -> None:
    from mizuoto_sdk.types import AudioChunk

    voice = tmp_path / "voices" / "mine"
    with service(agent.settings("faulty")) as host:
        value = host.load("faulty").prepare_voice(AudioChunk(np.zeros(480, "f4"), 16000), voice)
    assert value == {"samples": 480}
    assert (voice / "voice.json").read_text() == '{"samples": 480}'
    assert sorted(p.name for p in voice.parent.iterdir()) == ["mine"]  # no staging left


def test_a_silent_agent_fails_the_request_and_the_next_one_reconnects(
    agent: AgentProcess,
) -> None:
    settings = agent.settings("faulty", silent=True, **{"remote.heartbeat_timeout": 1.0})
    with service(settings) as host:
        model = host.load("faulty")
        with pytest.raises(WorkerFailed) as failed:
            model.call("sleep", {"seconds": 3})
        assert failed.value.detail["during"] == "heartbeat"
        assert failed.value.detail["host"] == "box"
        assert model.call("echo", {"again": 1}) == {"again": 1}


def test_a_wrong_token_is_refused_clearly(agent: AgentProcess, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("not the token")
    settings = agent.settings("faulty", **{"remote.hosts.box.token_file": str(wrong)})
    with service(settings) as host, pytest.raises(EngineUnavailable) as refused:
        host.load("faulty").call("echo", {})
    assert refused.value.detail["reason"] == "token"
    assert refused.value.detail["host"] == "box"


def test_an_agent_refuses_another_protocol(
    agent: AgentProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handshake, "PROTOCOL", 1)
    with service(agent.settings("faulty")) as host, pytest.raises(EngineUnavailable) as refused:
        host.load("faulty").call("echo", {})
    assert refused.value.detail["reason"] == "protocol"
    assert "same Mizuoto version" in refused.value.message


def test_killing_the_agent_mid_stream_gives_worker_failed(tmp_path: Path) -> None:
    doomed = AgentProcess(tmp_path)
    try:
        params = {"fault": "slow", "delay": 0.3, "chunks": 20}
        with service(doomed.settings("faulty")) as host:
            stream = host.load("faulty").synthesize("x", EngineRequest(params=params))
            next(stream)
            doomed.process.kill()
            with pytest.raises(WorkerFailed) as failed:
                collect(stream)
        assert failed.value.detail["host"] == "box"
        assert failed.value.detail["during"] == "synthesize"
    finally:
        doomed.process.kill()
        doomed.stop()


# -- the host refuses an agent of another protocol ----------------------------------------------


def test_the_host_refuses_an_agent_of_another_protocol(tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))

    def fake_agent() -> None:
        connection, _ = listener.accept()
        with connection:
            wire = FrameSocket(connection)
            wire.receive()  # the hello
            wire.send("ready", {"protocol": 3, "version": "9.9"})
            with contextlib.suppress(ConnectionClosed):
                wire.receive()  # the host closes

    thread = threading.Thread(target=fake_agent, daemon=True)
    thread.start()
    token = tmp_path / "token"
    token.write_text(TOKEN)
    host = client.RemoteHost("box", f"127.0.0.1:{listener.getsockname()[1]}", str(token))
    replica = client.RemoteReplica(host, engine_id="faulty", device="cpu", load={})
    with pytest.raises(EngineUnavailable) as refused:
        replica.start()
    thread.join(5)
    listener.close()
    assert refused.value.detail["reason"] == "protocol"
    assert "protocol 3" in refused.value.message and "9.9" in refused.value.message


# -- the wire -----------------------------------------------------------------------------------


@pytest.fixture
def pair() -> Iterator[tuple[FrameSocket, socket.socket]]:
    mine, theirs = socket.socketpair()
    theirs.settimeout(5)
    mine.settimeout(5)
    yield FrameSocket(mine, limit=1024), theirs
    mine.close()
    theirs.close()


def test_frames_round_trip_over_a_socket(pair: tuple[FrameSocket, socket.socket]) -> None:
    wire, peer = pair
    other = FrameSocket(peer)
    other.send("chunk", {"id": 1}, b"\x00\x01" * 100)
    other.send("heartbeat", {})
    assert wire.receive() == ("chunk", {"id": 1}, b"\x00\x01" * 100)
    assert wire.receive().kind == "heartbeat"


def test_a_frame_over_the_limit_is_refused_before_its_body(
    pair: tuple[FrameSocket, socket.socket],
) -> None:
    wire, peer = pair
    peer.sendall((10**6).to_bytes(4, "big") + b"xy")  # says a megabyte follows; two bytes do
    with pytest.raises(FrameError, match="limit of 1024"):
        wire.receive()  # returns at once: it never waits for the megabyte


def test_end_of_file_is_connection_closed(pair: tuple[FrameSocket, socket.socket]) -> None:
    wire, peer = pair
    peer.sendall(encode("heartbeat", {})[:7])
    peer.close()
    with pytest.raises(ConnectionClosed, match="inside a frame"):
        wire.receive()
    with pytest.raises(ConnectionClosed, match="between frames"):
        wire.receive()


# -- settings and plan ------------------------------------------------------------------------


def test_settings_take_remote_devices_and_hosts() -> None:
    settings = Settings(
        {
            "engines.sine.device": "gpu-box/cuda:1",
            "remote.hosts.gpu-box.address": "192.0.2.7:7373",
            "remote.hosts.gpu-box.tls": True,
            "remote.heartbeat_timeout": 2,
        }
    )
    assert settings.engine("sine", "device") == "gpu-box/cuda:1"
    assert settings.get("remote.heartbeat_timeout") == 2.0
    for key, value in [
        ("engines.sine.device", "box/gpu"),
        ("engines.sine.device", "a.b/cpu"),
        ("remote.hosts.box.address", "nowhere"),
        ("remote.hosts.box.tls", "yes"),
        ("remote.heartbeat_timeout", 0),
    ]:
        with pytest.raises(InvalidRequest) as error:
            settings.set(key, value)
        assert error.value.detail["field"] == key


def test_a_remote_device_plans_one_remote_replica() -> None:
    deployment = plan_deployment("sine", {}, ["cpu"], "box/cpu")
    assert (deployment.mode, deployment.host, deployment.replicas) == (
        "remote",
        "box",
        (("box/cpu",),),
    )
    for fields, field in [
        ({"replicas": 2}, "engines.sine.replicas"),
        ({"devices": ["cpu"]}, "engines.sine.devices"),
        ({"deployment": "local"}, "engines.sine.deployment"),
    ]:
        with pytest.raises(InvalidRequest) as error:
            plan_deployment("sine", fields, ["cpu"], "box/cpu")
        assert error.value.detail["field"] == field
    with pytest.raises(InvalidRequest, match="runs on cpu"):
        plan_deployment("sine", {}, ["cpu"], "box/cuda:0")


def test_a_remote_engine_without_its_address_names_the_setting() -> None:
    with service({"engines.sine.device": "box/cpu"}) as host, pytest.raises(InvalidRequest) as e:
        host.load("sine")
    assert e.value.detail["field"] == "remote.hosts.box.address"


def test_files_go_by_content_and_a_wrong_hash_is_refused(
    agent: AgentProcess, tmp_path: Path
) -> None:
    from mizuoto_sdk.remote.files import file_ref, put_frames

    data = tmp_path / "voice.bin"
    data.write_bytes(bytes(range(256)) * 64)
    ref = file_ref(data)
    host = client.RemoteHost("box", f"127.0.0.1:{agent.port}", str(agent.token_file))
    replica = client.RemoteReplica(
        host, engine_id="faulty", device="cpu", load={"model": "default"}
    )
    try:
        have = [({"files": [ref]}, b"")]
        assert replica.ask("have", have).header["missing"] == [ref["sha256"]]
        wrong = tmp_path / "wrong.bin"
        wrong.write_bytes(b"x" * int(ref["size"]))
        with pytest.raises(InvalidRequest) as refused:
            replica.ask("put", put_frames(ref, wrong, chunk=4096))
        assert refused.value.detail["reason"] == "hash_mismatch"
        replica.ask("put", put_frames(ref, data, chunk=4096))
        assert replica.ask("have", have).header["missing"] == []
    finally:
        replica.close()


def test_mizuoto_synth_through_an_agent_writes_the_local_bytes(
    agent: AgentProcess, tmp_path: Path
) -> None:
    remote = [f"--set={key}={value}" for key, value in agent.settings("sine").items()]
    outputs = []
    for name, extra in (("local", []), ("remote", remote)):
        target = tmp_path / f"{name}.wav"
        command = [sys.executable, "-m", "mizuoto_sdk.cli", "synth", "sine", "hello"]
        subprocess.run(
            [*command, "-o", str(target), "--seed", "7", *extra], check=True, timeout=120
        )
        outputs.append(target.read_bytes())
    assert outputs[0] == outputs[1]


# -- a load that hangs while the agent's heartbeats keep coming -------------------------------


def test_a_hung_remote_load_ends_at_the_requests_timeout(agent: AgentProcess, site: None) -> None:
    # What a user saw: the call waited as long as the load took, heartbeats keeping it alive.
    with service(agent.settings("faulty")) as host:  # the agent's heartbeat: every 0.2 s
        model = host.load("faulty", options={"load_delay": 3.0})
        with pytest.raises(OperationTimeoutError) as caught:
            model.call("echo", {}, EngineRequest(timeout=0.5))
    assert caught.value.detail["during"] == "load"
    assert caught.value.detail["host"] == "box"


def test_a_hung_remote_load_ends_at_the_load_timeout(agent: AgentProcess, site: None) -> None:
    settings = agent.settings("faulty", **{"remote.load_timeout": 0.5})
    with service(settings) as host:
        # not the options of the test above: a model, and a load, of its own
        model = host.load("faulty", "default", options={"load_delay": 2.5})
        with pytest.raises(OperationTimeoutError) as caught:
            model.call("echo", {})  # no timeout of its own: the setting bounds the load
        assert caught.value.detail["field"] == "remote.load_timeout"
        assert "remote.load_timeout = 0.5 s" in caught.value.message
        assert model.replicas[0].state in ("stopped", "failed")  # the next call connects again


def test_remote_load_timeout_is_a_setting() -> None:
    settings = Settings({"remote.load_timeout": 30})
    assert settings.get("remote.load_timeout") == 30.0
    assert Settings().get("remote.load_timeout") == 600.0
    with pytest.raises(InvalidRequest) as error:
        settings.set("remote.load_timeout", 0)
    assert error.value.detail["field"] == "remote.load_timeout"


def test_a_request_past_its_timeout_is_freed_though_the_engine_is_deaf(tmp_path: Path) -> None:
    # What a user saw: an engine deaf to cancel held its remote caller for ever, although the
    # request had a timeout and the agent's heartbeats kept coming.
    doomed = AgentProcess(tmp_path)  # its engine hangs for good: it is killed at the end
    host = client.RemoteHost(
        "box", f"127.0.0.1:{doomed.port}", str(doomed.token_file), stop_timeout=0.5
    )
    replica = client.RemoteReplica(host, engine_id="faulty", device="cpu", load={})
    try:
        params = {"seed": 1, "chunks": 3, "fault": "hang", "at": 1}
        header = {"capability": "synthesize", "text": "x", "params": params, "timeout": 0.5}
        replica.reserve()
        stream = exchange.stream(replica, header, b"", EngineRequest(timeout=0.5))
        next(stream)  # chunk 0; chunk 1 never comes
        with pytest.raises(OperationTimeoutError) as caught:
            next(stream)
        assert "host.stop_timeout" in caught.value.message
        replica.reserve()
        reply = exchange.run(
            replica,
            {"capability": "call", "op": "echo", "arguments": {"a": 1}},
            b"",
            EngineRequest(),
        )
        assert reply.header["value"] == {"a": 1}  # the session goes on
    finally:
        replica.close()
        doomed.process.kill()
        doomed.stop()
