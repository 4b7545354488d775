"""``mizuoto runtime`` and ``mizuoto doctor`` with a server running: they ask it through
server.json and its API, and say so; without a live one they describe their own process."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from mizuoto_sdk.cli import main
from mizuoto_sdk.errors import EngineNotFound, InvalidRequest
from mizuoto_sdk.server.client import ServerClient, ServerError, ServerUnreachable, find_server
from mizuoto_sdk.server.record import ServerRecord, read_record, write_record


@pytest.fixture
def at_server(server, monkeypatch):
    """This process's commands find the session's server (its data folder holds server.json)."""
    monkeypatch.setenv("MIZUOTO_HOME", str(server.home))
    return server


@pytest.fixture
def record(server) -> ServerRecord:
    found = read_record(server.home / "server.json")
    assert found is not None and found.pid == server.pid
    return found


def _load(server) -> str:
    answer = server.client.post(
        "/api/v1/runtime/load", json={"engine": "sine", "model": None, "device": None}
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["model"])


def _names(server) -> set[str]:
    return {model["name"] for model in server.client.get("/api/v1/runtime").json()["models"]}


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _dead_pid() -> int:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait(timeout=60)
    return done.pid


def test_runtime_in_a_shell_lists_the_servers_models_and_names_the_server(server):
    name = _load(server)
    done = subprocess.run(
        [sys.executable, "-m", "mizuoto_sdk.cli", "runtime"],
        env={**os.environ, **server.env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"server {server.url} (pid {server.pid})"
    assert any(line.startswith(f"{name} (") for line in lines[1:]), done.stdout


def test_load_and_unload_through_the_command_change_the_servers_models(at_server, capsys):
    server = at_server
    assert main(["runtime", "--load", "sine", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"server {server.url} (pid {server.pid})"]
    listed = {model["name"] for model in json.loads(out)}  # stdout is the JSON alone
    (name,) = {n for n in listed if n.startswith("sine/")}
    assert name in _names(server)

    assert main(["runtime", "--unload", name]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [f"server {server.url} (pid {server.pid})", f"unloaded: {name}"]
    assert not any(line.startswith(f"{name} ") for line in lines[2:])
    assert name not in _names(server)


def test_doctor_prints_the_servers_report(at_server, capsys):
    server = at_server
    server.client.get("/api/v1/runtime/doctor")  # its first run imports the implementations
    code = main(["doctor", "--json"])
    out, err = capsys.readouterr()
    report = server.client.get("/api/v1/runtime/doctor").json()
    assert json.loads(out) == report
    assert err.splitlines() == [f"server {server.url} (pid {server.pid})"]
    assert code == (0 if all(engine["available"] for engine in report["engines"]) else 1)

    assert main(["doctor", "sine"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"server {server.url} (pid {server.pid})"
    assert "engine sine: available" in lines


def test_the_servers_error_codes_keep_their_meaning_and_exit_codes(at_server, record, capsys):
    assert main(["doctor", "no-such-engine"]) == 2
    assert "[engine_not_found]" in capsys.readouterr().err
    assert main(["runtime", "--unload", "no-such/model@cpu"]) == 2
    assert "[invalid_request]" in capsys.readouterr().err

    client = ServerClient(record)
    with pytest.raises(EngineNotFound):
        client.get("/api/v1/engines/no-such-engine/doctor")
    with pytest.raises(InvalidRequest) as refused:
        client.post("/api/v1/runtime/unload", {"model": "no-such/model@cpu"})
    assert refused.value.detail["field"] == "model"
    with pytest.raises(ServerError) as missing:  # a server's own code, not an engine's
        client.get("/api/v1/no-such-path")
    assert (missing.value.code, missing.value.status) == ("not_found", 404)
    if record.token is not None:
        wrong = ServerClient(dataclasses.replace(record, token="not-the-token"))
        with pytest.raises(ServerError) as unauthorized:
            wrong.get("/api/v1/runtime")
        assert (unauthorized.value.code, unauthorized.value.status) == ("unauthorized", 401)


def test_set_with_a_server_running_is_a_usage_error(at_server, capsys):
    assert main(["runtime", "--set", "compute.max_resident_models=1"]) == 2
    assert "keeps its own settings" in capsys.readouterr().err


def test_a_stale_server_json_leaves_the_command_on_its_own_process(tmp_path, monkeypatch, capsys):
    pid = _dead_pid()
    port = _closed_port()
    stale = ServerRecord(f"http://127.0.0.1:{port}", "127.0.0.1", port, pid, "0", None, time.time())
    path = write_record(stale, tmp_path / "server.json")
    monkeypatch.setenv("MIZUOTO_HOME", str(tmp_path))
    why = f"this process: {path} names pid {pid}, which is not running"

    assert main(["runtime"]) == 0
    assert capsys.readouterr().out.splitlines() == [why, "no models loaded in this process"]
    assert main(["doctor", "sine", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [why]
    assert [engine["id"] for engine in json.loads(out)["engines"]] == ["sine"]
    assert path.exists()  # left for the next server to replace


def test_find_server_asks_the_pid_in_server_json_and_says_why_not(server, record, tmp_path):
    assert find_server(tmp_path / "server.json") == (
        None,
        f"this process: no server running (no server.json in {tmp_path})",
    )
    client, where = find_server(server.home / "server.json")
    assert client is not None and where == f"server {server.url} (pid {server.pid})"
    health = client.get("/api/v1/health")
    assert isinstance(health, dict) and health["pid"] == server.pid

    # a live pid (this test's) at the server's address: another server answers there
    path = write_record(dataclasses.replace(record, pid=os.getpid()), tmp_path / "server.json")
    client, where = find_server(path)
    assert client is None
    assert where == (
        f"this process: {path} names pid {os.getpid()}, but {server.url} answers as "
        f"pid {server.pid}"
    )

    # a live pid where nothing listens
    port = _closed_port()
    url = f"http://127.0.0.1:{port}"
    silent = dataclasses.replace(record, pid=os.getpid(), url=url, port=port)
    client, where = find_server(write_record(silent, path))
    assert client is None
    assert where.startswith(f"this process: {path} names pid {os.getpid()}, which does not ")
    assert url in where
    with pytest.raises(ServerUnreachable, match=url):
        ServerClient(silent).get("/api/v1/runtime")
