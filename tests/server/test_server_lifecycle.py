"""A server's life: killed, its engines' children die with it and its server.json stays behind;
the next one replaces that file, checks its token, refuses a twin, and on a clean stop ends the
work in flight and removes its file (their own ``mizuoto serve`` subprocesses, beside the
session's)."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from server_support import server_env, start_server, stop_server

from mizuoto_sdk.cli import main
from mizuoto_sdk.cli.common import Usage
from mizuoto_sdk.cli.serve import server_token

TOKEN = "s3cret-token_for.tests"


def until(condition: Callable[[], bool], seconds: float = 30.0) -> bool:
    """Poll another process's state until ``condition`` holds, at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def is_running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the children")
def test_a_killed_servers_file_is_replaced_by_a_token_server_that_stops_cleanly(
    tmp_path: Path,
) -> None:
    """A server killed (SIGKILL) mid-stream leaves its file, but not its engine's child. The
    next server replaces the file, checks its token and refuses a twin. Stopped by SIGTERM with
    three streams in flight, each of whose engines started a child and takes a second to clean
    up, it cancels them at once and ends each stream only once its engine's ``finally`` has
    run; every child dies, the file goes, and the server ends by the signal."""
    home = tmp_path / "home"
    settings = tmp_path / "settings.toml"
    settings.write_text("")
    env = server_env(home, settings)
    killed, stale, _ = start_server(home, env)
    log = tmp_path / "killed.log"
    params = {"log": str(log), "child": True, "hold_at": 1}
    body = {"engine": "witness", "text": "x", "params": params}
    with (
        httpx.Client(base_url=str(stale["url"]), timeout=60) as client,
        client.stream("POST", "/api/v1/synthesize", json=body) as answer,
    ):
        received = answer.iter_raw()  # held: dropped, it closes the connection
        next(received)
        child = int(log.read_text().split()[1])
        killed.kill()
        killed.wait()
    assert until(lambda: not is_running(child)), "the child outlived its killed server"
    assert json.loads((home / "server.json").read_text())["pid"] == killed.pid  # left behind
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    process, record, _ = start_server(home, env, "--token-file", str(token_file))
    try:
        assert record["pid"] == process.pid and record["token"] == TOKEN
        url = str(record["url"])
        with httpx.Client(base_url=url, timeout=30) as client:
            refused = client.get("/api/v1/health")
            assert refused.status_code == 401 and refused.json()["code"] == "unauthorized"
            wrong = client.get("/api/v1/runtime", headers={"authorization": "Bearer nope"})
            assert wrong.status_code == 401
            page = client.get("/", params={"token": "nope"})
            assert page.status_code == 401
            bearer = client.get("/api/v1/health", headers={"authorization": f"Bearer {TOKEN}"})
            assert bearer.json()["pid"] == process.pid
            opened = client.get("/", params={"token": TOKEN}, follow_redirects=False)
            assert opened.status_code == 303 and opened.headers["location"] == "/"
            assert "httponly" in opened.headers["set-cookie"].lower()
            assert client.get("/api/v1/runtime").status_code == 200  # the cookie carries it
        twin = subprocess.run(
            [sys.executable, "-m", "mizuoto_sdk.cli", "serve", "--port", "0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert twin.returncode == 2 and f"a server already runs at {url}" in twin.stderr
        assert json.loads((home / "server.json").read_text())["pid"] == process.pid
        logs = [tmp_path / f"stream-{index}.log" for index in range(3)]
        held: list[Iterator[bytes]] = []
        with contextlib.ExitStack() as streams:
            client = streams.enter_context(
                httpx.Client(base_url=url, timeout=60, headers={"authorization": f"Bearer {TOKEN}"})
            )
            for log in logs:
                params = {"log": str(log), "child": True, "hold_at": 1, "unwind": 1.0}
                body = {"engine": "witness", "text": "x", "params": params}
                answer = streams.enter_context(
                    client.stream("POST", "/api/v1/synthesize", json=body)
                )
                assert answer.status_code == 200
                held.append(answer.iter_raw())  # held: dropped, it closes the connection
                next(held[-1])  # the first chunk: the stream is in flight
            children = [int(log.read_text().split()[1]) for log in logs]  # "child PID" comes first
            assert all(map(is_running, children))
            process.send_signal(signal.SIGTERM)
            for received, log in zip(held, logs, strict=True):
                with contextlib.suppress(httpx.HTTPError):  # cut: the body ends incomplete
                    for _ in received:
                        pass
                # the engine unwound before its stream was ended, not after
                assert log.read_text().splitlines()[-1] == "finally", log.read_text()
        assert stop_server(process) == -signal.SIGTERM
    finally:
        stop_server(process)
    assert not (home / "server.json").exists()
    assert not any(map(is_running, children)), "a child outlived the server"


def test_a_server_beyond_loopback_always_has_a_token() -> None:
    first, second = server_token("0.0.0.0", None), server_token("192.0.2.10", None)
    assert first and second and first != second and len(first) >= 32
    for loopback in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert server_token(loopback, None) is None


def test_a_token_that_cannot_travel_in_a_header_is_refused(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("two words\n")
    with pytest.raises(Usage, match="--token-file"):
        server_token("127.0.0.1", token_file)


def test_serve_without_the_server_extra_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn now fails
    assert main(["serve", "--port", "0"]) == 2
    assert 'pip install "mizuoto-sdk[server]"' in capsys.readouterr().err


def test_a_data_folder_that_cannot_take_server_json_is_refused_before_listening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("MIZUOTO_HOME", str(blocker / "home"))
    assert main(["serve", "--port", "0"]) == 2
    error = capsys.readouterr().err
    assert f"the data folder {blocker / 'home'} cannot be made" in error
    assert "MIZUOTO_HOME" in error


def test_connections_on_the_servers_socket_send_each_chunk_at_once() -> None:
    """Nagle's algorithm is off on what the server accepts (asyncio sets TCP_NODELAY only on a
    socket that says it is TCP): a streamed chunk never waits for the client's delayed ACK."""
    import asyncio
    import socket

    from mizuoto_sdk.server.serve import listen

    class Accepting(asyncio.Protocol):
        def __init__(self, accepted: asyncio.Future[asyncio.BaseTransport]) -> None:
            self.accepted = accepted

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.accepted.set_result(transport)

    async def accepted_nodelay() -> int:
        loop = asyncio.get_running_loop()
        accepted: asyncio.Future[asyncio.BaseTransport] = loop.create_future()
        sock = listen("127.0.0.1", 0)
        server = await loop.create_server(lambda: Accepting(accepted), sock=sock)
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        transport = await asyncio.wait_for(accepted, 30)
        option = transport.get_extra_info("socket").getsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY
        )
        writer.close()
        transport.close()
        server.close()
        await server.wait_closed()
        return int(option)

    assert asyncio.run(accepted_nodelay()) == 1


def test_one_server_lock_per_data_folder_however_many_try_at_once(tmp_path: Path) -> None:
    """Two ``mizuoto serve`` started at the same moment: exactly one may run (the lock, not the
    server.json both would find missing)."""
    import threading

    from mizuoto_sdk.server.record import ServerLock

    locks = [ServerLock(tmp_path / "home") for _ in range(8)]
    start = threading.Barrier(len(locks))
    won: list[bool] = [False] * len(locks)

    def take(index: int) -> None:
        start.wait()
        won[index] = locks[index].acquire()

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(locks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert won.count(True) == 1
    winner = locks[won.index(True)]
    other = locks[won.index(False)]
    assert not other.acquire()
    winner.release()
    assert other.acquire()  # released: the next server may run
    other.release()
    elsewhere = ServerLock(tmp_path / "elsewhere")
    assert elsewhere.acquire()  # another data folder: its own lock
    elsewhere.release()
