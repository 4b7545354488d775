"""The commands with a model served by worker processes (``engines.<id>.replicas``): the same
audio as in this process, the replicas and their workers shown, and no worker left behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from mizuoto_sdk.cli import main
from mizuoto_sdk.host import RuntimeService


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
