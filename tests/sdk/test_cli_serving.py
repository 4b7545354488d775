"""The commands with a model served by worker processes (``engines.<id>.replicas``): the same
audio as in this process, the replicas and their workers shown, and no worker left behind."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from mizuoto_sdk.cli import main
from mizuoto_sdk.host import RuntimeService

SERVING_SITE = Path(__file__).parent / "serving_site"
STOP_BOUND = 30.0  # seconds: the stop itself takes well under one; far below the child's 60 s


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_synth_on_two_replicas_writes_the_inline_bytes(tmp_path):
    served, inline = tmp_path / "served.wav", tmp_path / "inline.wav"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mizuoto_sdk.cli",
            "synth",
            "sine",
            "hello world",
            "-o",
            str(served),
            "--set",
            "engines.sine.replicas=2",
            "--seed",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "(seed 1)" in done.stdout
    assert main(["synth", "sine", "hello world", "-o", str(inline), "--seed", "1"]) == 0
    assert served.read_bytes() == inline.read_bytes()


def test_a_deployment_that_cannot_run_is_a_usage_error_naming_the_fix(tmp_path, capsys):
    out = tmp_path / "x.wav"
    argv = ["synth", "sine", "hi", "-o", str(out), "--set", "engines.sine.replicas=2"]
    assert main([*argv, "--set", "engines.sine.deployment=inline"]) == 2
    error = capsys.readouterr().err
    assert "[invalid_request]" in error
    assert 'engines.sine.deployment = "local"' in error
    assert not out.exists()


def test_runtime_shows_each_replica_and_its_worker(capsys):
    with RuntimeService({"engines.sine.replicas": 2}) as service:
        assert main(["runtime", "--load", "sine"], service) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].startswith("sine/tone@cpu") and lines[0].endswith("idle, local, 2 replicas")
        shown = r"  replica (\d): ready, healthy, 0 in flight, on cpu, pid (\d+)"
        replicas = [re.fullmatch(shown, line) for line in lines[1:]]
        assert all(replicas) and [m.group(1) for m in replicas if m] == ["0", "1"]
        pids = {int(m.group(2)) for m in replicas if m}
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
        assert main(["runtime", "--json"], service) == 0
        (row,) = json.loads(capsys.readouterr().out)
        assert row["mode"] == "local"
        assert {pid for replica in row["replicas"] for pid in replica["pids"]} == pids
    assert not any(alive(pid) for pid in pids)  # closing the host stopped its workers


def test_runtime_json_with_set_and_no_worker_outlives_the_command(capsys):
    argv = ["runtime", "--set", "engines.sine.replicas=2", "--load", "sine", "--json"]
    assert main(argv) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["mode"] == "local"
    assert [r["healthy"] for r in row["replicas"]] == [True, True]
    pids = [pid for replica in row["replicas"] for pid in replica["pids"]]
    assert len(set(pids)) == 2
    assert not any(alive(pid) for pid in pids)


def test_synth_on_replicas_stopped_by_sigterm_ends_its_calls_and_its_output(tmp_path):
    """The engine starts a child at chunk 1 and waits there (fault=child); SIGTERM then stops
    the command, which stops its workers: the engine's finally runs, its child dies, and a
    caller reading the command's output through pipes sees them end."""
    paths = [str(SERVING_SITE), *filter(None, [os.environ.get("PYTHONPATH")])]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    argv = ["synth", "faulty", "hi", "-o", str(tmp_path / "out.wav")]
    argv += ["--set", "engines.faulty.replicas=2", "--param", "fault=child"]
    argv += ["--param", "at=1", "--param", f"marker={tmp_path}"]
    command = subprocess.Popen(
        [sys.executable, "-m", "mizuoto_sdk.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )
    try:
        child = int(_marker(tmp_path, "child", command))
        command.send_signal(signal.SIGTERM)
        _, err = command.communicate(timeout=STOP_BOUND)
    finally:
        command.kill()
        command.communicate()
    assert command.returncode == -signal.SIGTERM and err.endswith("mizuoto: terminated\n"), err
    assert (tmp_path / "finally.pid").is_file()  # the engine's cleanup ran in its worker
    assert not alive(child) and not (tmp_path / "out.wav").exists()


def _marker(folder: Path, name: str, command: subprocess.Popen[str]) -> str:
    """The marker file's text once the engine wrote it (the command must still run)."""
    path, deadline = folder / f"{name}.pid", time.monotonic() + 60
    while not path.exists():
        assert command.poll() is None, command.communicate()
        assert time.monotonic() < deadline, f"no {name} marker within 60 s"
        with contextlib.suppress(subprocess.TimeoutExpired):
            command.wait(0.02)
    return path.read_text()
