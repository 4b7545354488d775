"""``server.json`` in the data folder: where the running server listens, its pid and its token.

``mizuoto serve`` writes it once it listens and removes it on a clean stop; ``mizuoto runtime``
and ``mizuoto doctor`` read it to ask that server. A file whose pid is not running is stale (the
server was killed): it is reported as such and the next ``serve`` replaces it. The file may hold a
token, so it is written readable by its owner only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

SERVER_FILE = "server.json"
LOCK_FILE = "server.lock"


@dataclass(frozen=True)
class ServerRecord:
    """What ``server.json`` says about the server that wrote it."""

    url: str  # "http://127.0.0.1:7370" ("https://" over TLS), no trailing slash
    host: str
    port: int
    pid: int
    version: str
    token: str | None  # set when the server checks a token on every request
    started: float  # time.time() when it started listening
    tls_cert: str | None = None  # over TLS: the certificate's file, which local commands trust

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def record_path(home: Path | None = None) -> Path:
    """``server.json`` in ``home``, by default the data folder (``MIZUOTO_HOME``, else the
    platform's user data folder)."""
    if home is None:
        from mizuoto_sdk.host.models import data_home

        home = data_home()
    return home / SERVER_FILE


def write_record(record: ServerRecord, path: Path | None = None) -> Path:
    """Write ``record`` atomically (a reader never sees half a file), readable by its owner only."""
    path = path or record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=".server-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:  # mkstemp made it 0600
            json.dump(record.as_dict(), out, indent=2)
            out.write("\n")
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path


def read_record(path: Path | None = None) -> ServerRecord | None:
    """The record in ``path``; None when there is none, or when it is not a record (logged)."""
    path = path or record_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return ServerRecord(
            url=str(data["url"]),
            host=str(data["host"]),
            port=int(data["port"]),
            pid=int(data["pid"]),
            version=str(data["version"]),
            token=None if data.get("token") is None else str(data["token"]),
            started=float(data["started"]),
            tls_cert=None if data.get("tls_cert") is None else str(data["tls_cert"]),
        )
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning("%s is not a server record (%s): ignored", path, error)
        return None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one of another user counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_record(path: Path | None = None) -> tuple[ServerRecord | None, str]:
    """The record when its pid is running, with ``""``; else None and why: ``""`` when there is
    no file, else what is wrong with it. A stale file stays for the next ``serve`` to replace."""
    path = path or record_path()
    record = read_record(path)
    if record is None:
        return None, f"{path} is not a server record" if path.exists() else ""
    if not pid_alive(record.pid):
        return None, f"{path} names pid {record.pid}, which is not running"
    return record, ""


def remove_record(pid: int, path: Path | None = None) -> bool:
    """Remove ``server.json`` if it is this pid's: a newer server's file stays where it is."""
    path = path or record_path()
    record = read_record(path)
    if record is None or record.pid != pid:
        return False
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True


class ServerLock:
    """The one server of a data folder: an exclusive advisory lock on ``server.lock`` beside
    ``server.json``, held while it runs. Two servers started at the same moment cannot both get
    it, and the kernel lets it go when the process ends, however it ends (the empty file stays).
    Where the platform has no ``fcntl`` (Windows) there is no lock: ``acquire`` always succeeds.
    """

    def __init__(self, home: Path | None = None) -> None:
        self.path = record_path(home).with_name(LOCK_FILE)
        self._file: IO[str] | None = None

    def acquire(self) -> bool:
        """Take the lock now, or say False at once when another process (or holder) has it."""
        try:
            import fcntl
        except ImportError:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        held = open(self.path, "a")  # noqa: SIM115  # kept open for as long as the lock is held
        try:
            fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # BlockingIOError: someone holds it
            held.close()
            return False
        self._file = held
        return True

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the descriptor lets the lock go
            self._file = None
