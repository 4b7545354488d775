"""`mizuoto agent` stopped by SIGTERM while a host streams from it: the request in flight is
answered (engine_unavailable, reason agent_stopped), its engine unwinds within host.stop_timeout
(the engine's finally runs, the child it started with ctx.open_process dies) and the agent ends by
the signal, without a traceback.

The engine is the server tests' ``witness`` (tests/server/server_site), which writes each step of
a stream to a log file, starts a child first and holds at a chunk until it is cancelled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from serving_support import wait_until

from mizuoto_sdk.discovery import Discovery
from mizuoto_sdk.errors import EngineError, EngineUnavailable
from mizuoto_sdk.host import EngineRequest, RuntimeService

WITNESS = Path(__file__).parents[1] / "server" / "server_site"

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM is a POSIX signal")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def logged(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@contextlib.contextmanager
def witness_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[subprocess.Popen[str], dict[str, object]]]:
    """A `mizuoto agent` that serves the witness, and the host settings that reach it."""
    monkeypatch.syspath_prepend(str(WITNESS))  # the host reads the witness's manifest too
    token = tmp_path / "token"
    token.write_text("a secret long enough for a test\n")
    path = os.pathsep.join(p for p in (str(WITNESS), os.environ.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "mizuoto_sdk.cli", "agent", "--listen", "127.0.0.1:0"]
    agent = subprocess.Popen(
        [*command, "--token-file", str(token)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert agent.stdout is not None and agent.stderr is not None
    try:
        line = agent.stdout.readline()
        assert line.startswith("mizuoto agent listening on tcp://"), line
        yield (
            agent,
            {
                "engines.witness.device": "box/cpu",
                "remote.hosts.box.address": line.strip().rsplit("://", 1)[1],
                "remote.hosts.box.token_file": str(token),
            },
        )
    finally:
        agent.kill()
        agent.wait()
        agent.stdout.close()
        agent.stderr.close()


def started_child(log: Path) -> int:
    started = wait_until(lambda: logged(log)[:1], 60, "the engine's child started")
    child = int(started[0].split()[1])
    assert alive(child)
    return child


def test_sigterm_mid_stream_unwinds_the_engine_and_ends_its_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a user saw: the engine's finally never ran and its open_process child kept running.
    log = tmp_path / "witness.log"
    # a child first, chunk 0, then a hold at chunk 1 until cancelled; cleanup takes 1 s
    params = {"log": str(log), "child": True, "chunks": 3, "hold_at": 1, "unwind": 1.0}
    discovery = Discovery(path=[str(WITNESS), *sys.path], selection=None)
    with witness_agent(tmp_path, monkeypatch) as (agent, settings):
        with RuntimeService(settings, discovery) as host:
            stream = host.load("witness").synthesize("x", EngineRequest(params=params))
            next(stream)
            child = started_child(log)
            agent.send_signal(signal.SIGTERM)
            with pytest.raises(EngineUnavailable) as stopped:
                next(stream)
            assert stopped.value.detail["reason"] == "agent_stopped"
        assert agent.wait(60) == -signal.SIGTERM
        assert logged(log)[-1] == "finally"
        wait_until(lambda: not alive(child), 30, "the engine's child gone")
        assert agent.stderr is not None
        errors = agent.stderr.read()
        assert "Traceback" not in errors, errors


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal")
def test_sigkill_mid_stream_fails_the_stream_and_the_engines_child_dies_with_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No handler of the agent runs: its engine's child dies of its parent-death signal.
    log = tmp_path / "witness.log"
    params = {"log": str(log), "child": True, "chunks": 3, "hold_at": 1}
    discovery = Discovery(path=[str(WITNESS), *sys.path], selection=None)
    with witness_agent(tmp_path, monkeypatch) as (agent, settings):
        with RuntimeService(settings, discovery) as host:
            stream = host.load("witness").synthesize("x", EngineRequest(params=params))
            next(stream)
            child = started_child(log)
            agent.kill()
            with pytest.raises(EngineError) as lost:
                next(stream)
            assert lost.value.code in ("worker_failed", "engine_unavailable")
        assert agent.wait(60) == -signal.SIGKILL
        wait_until(lambda: not alive(child), 30, "the engine's child gone")
