"""A pre-started interpreter that forks one child per isolated run (Linux only).

Each isolated run (``mizuoto_contract.isolated``) needs a process whose baseline predates the
engine's code but follows torch's import, and importing torch costs about two seconds of CPU. A
process that imported torch, numpy and the host already, and then forks, gives such a child in
milliseconds: the child still holds no engine code, and reads its baseline itself. The zygote has
a hash seed of its own (never the caller's PYTHONHASHSEED). Elsewhere, or when forking is not
safe, each run starts its own interpreter.

Protocol, one JSON line each way: the caller sends ``{"run", "argv", "env", "path", "output"}``; the
zygote answers ``{"pid"}`` once the child runs and ``{"exit"}`` when it ends. Closing the
zygote's stdin ends it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

_LOCK = threading.Lock()
# Held from a fork until its exit is read: the zygote answers one child at a time.
_ONE_CHILD = threading.Lock()
_RUNNING: dict[str, Zygote] = {}


def available() -> bool:
    return sys.platform == "linux" and hasattr(os, "fork")


class ForkedChild:
    """A forked run as ``subprocess.Popen`` shows one: ``wait``, ``poll``, ``kill``."""

    def __init__(self, zygote: Zygote, pid: int, output: Path) -> None:
        self._zygote = zygote
        self.pid = pid
        self.output = output
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._zygote.read_exit(self, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self._zygote.read_exit(self, timeout):
            raise subprocess.TimeoutExpired("mizuoto_contract.forkserver", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, 9)

    def communicate(self) -> tuple[str, str]:
        self.wait()
        return "", ""


class Zygote:
    def __init__(self, environment: dict[str, str], cwd: str) -> None:
        # Children inherit the server's folder: a server per folder, so no child changes its own.
        self.cwd = cwd
        self._process = subprocess.Popen(
            [sys.executable, "-m", "mizuoto_contract.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=environment,
            cwd=cwd,
        )
        # The server ends when its stdin closes; closing it at exit (and reaping the server)
        # leaves no process behind the run that started it.
        atexit.register(self.close)

    def close(self) -> None:
        if self._process.stdin is not None:
            with contextlib.suppress(OSError):
                self._process.stdin.close()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()

    def alive(self) -> bool:
        return self._process.poll() is None

    def fork(
        self,
        argv: list[str],
        environment: dict[str, str],
        output: Path,
        path: list[str],
        run: str = "isolated",
    ) -> ForkedChild:
        request = {
            "run": run,
            "argv": argv,
            "env": environment,
            "path": path,
            "output": str(output),
        }
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        answer = json.loads(self._process.stdout.readline() or '{"pid": 0}')
        if not answer.get("pid"):
            raise OSError("the contract's fork server did not start a child")
        return ForkedChild(self, answer["pid"], output)

    def read_exit(self, child: ForkedChild, timeout: float | None) -> bool:
        """Read the child's exit line within ``timeout``; False when it has not ended yet."""
        stdout = self._process.stdout
        assert stdout is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, _, _ = select.select([stdout], [], [], left)
            if ready:
                line = stdout.readline()
                child.returncode = int(json.loads(line)["exit"]) if line else -9
                _ONE_CHILD.release()
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False


def _running(environment: dict[str, str], cwd: str) -> Zygote:
    """The zygote serving ``cwd``, started if none runs there (call with ``_LOCK`` and the
    one-child slot held, so no child of a zygote it replaces is still running)."""
    zygote = _RUNNING.get("zygote")
    if zygote is not None and zygote.alive() and zygote.cwd != cwd:
        zygote.close()
        zygote = None
    if zygote is None or not zygote.alive():
        zygote = _RUNNING["zygote"] = Zygote(environment, cwd)
    return zygote


def warm(environment: dict[str, str], cwd: str) -> None:
    """Start the zygote now (it imports torch, which takes a while) if none runs. One running
    elsewhere is left to ``fork``, which replaces it only when no child is in flight."""
    with _LOCK:
        zygote = _RUNNING.get("zygote")
        if zygote is None or not zygote.alive():
            _RUNNING["zygote"] = Zygote(environment, cwd)


def fork(
    argv: list[str],
    environment: dict[str, str],
    output: Path,
    cwd: str,
    path: list[str],
    run: str = "isolated",
) -> ForkedChild:
    """Run ``python -m mizuoto_contract.isolated *argv`` (``run="check"``: one check, see
    ``childcheck``) as a fork of the zygote, starting the zygote on first use (with
    ``environment``, whose PYTHONHASHSEED differs from the caller's).

    Runs are one at a time: a second fork waits until the first child's exit has been read
    (``wait``, or ``kill`` then ``wait``).
    """
    _ONE_CHILD.acquire()
    try:
        with _LOCK:
            return _running(environment, cwd).fork(argv, environment, output, path, run)
    except BaseException:
        _ONE_CHILD.release()
        raise
