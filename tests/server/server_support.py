"""Starting and stopping a real ``mizuoto serve`` subprocess for the server's tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

SERVING_SITE = Path(__file__).parents[1] / "sdk" / "serving_site"  # the faulty engine
WITNESS_SITE = Path(__file__).with_name("server_site")  # the witness engine
START_TIMEOUT = 60.0


@dataclass
class RunningServer:
    url: str
    pid: int
    home: Path
    env: dict[str, str]
    record: dict[str, object]
    client: httpx.Client
    process: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def server_env(home: Path, settings: Path) -> dict[str, str]:
    """The environment of a command that should find the server whose data folder is ``home``."""
    env = dict(os.environ)
    env["MIZUOTO_HOME"] = str(home)
    env["MIZUOTO_SETTINGS"] = str(settings)
    sites = [str(SERVING_SITE), str(WITNESS_SITE), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, sites))
    env.pop("MIZUOTO_PLUGINS", None)
    return env


def start_server(
    home: Path, env: dict[str, str], *arguments: str
) -> tuple[subprocess.Popen[bytes], dict[str, object], Path]:
    """``mizuoto serve --port 0 ARGUMENTS`` started, once its server.json names it."""
    log = home.parent / f"{home.name}-server.log"
    record_file = home / "server.json"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "mizuoto_sdk.cli", "serve", "--port", "0", *arguments],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"mizuoto serve exited {process.returncode}:\n{log.read_text()}")
        try:
            record = json.loads(record_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(0.05)  # polling a file another process writes; bounded by the deadline
            continue
        if record.get("pid") == process.pid:
            return process, record, log
        time.sleep(0.05)
    stop_server(process)
    raise AssertionError(
        f"mizuoto serve wrote no server.json in {START_TIMEOUT} s:\n{log.read_text()}"
    )


def stop_server(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM (a clean stop), then SIGKILL if it does not end in 30 s; the exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()
