"""The agent's cache of files that arrived by content (see ``remote/files.py``).

``have`` says which files it lacks, ``put`` receives them in pieces (checked against their hash
before they are kept), ``path`` turns a reference into the cached file or folder, and ``collect``
deletes what no host asked for in 30 days. The cache keeps ``<root>/<sha256>/<name>``; nothing
outside ``root`` is ever read or written for a host.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.remote.files import (
    FOLDER_MANIFEST,
    MAX_AGE,
    checked_name,
    checked_sha,
    natural,
    parse_ref,
    relative_path,
    sha256_file,
)

__all__ = ["FileCache"]

_PARTIAL = ".partial"
_SHA256 = re.compile(r"[0-9a-f]{64}")


class FileCache:
    """The agent's files by content under ``root`` (``<root>/<sha256>/<name>``); thread-safe.

    A file's last use is its folder's modification time: ``have`` and ``path`` touch it, and
    ``collect`` deletes the folders no host used in ``max_age`` seconds.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self._partial: dict[tuple[str, str, str], tuple[Path, int]] = {}

    def have(self, files: Sequence[Mapping[str, object]]) -> list[str]:
        """The hashes among ``files`` (``{"sha256", "name", "size"}``) not in the cache, in
        order; the ones there count as used."""
        missing: list[str] = []
        for index, ref in enumerate(files):
            if not isinstance(ref, Mapping):
                raise InvalidRequest(
                    f"files[{index}]: expected {{sha256, name, size}}, got {ref!r}",
                    {"field": f"files[{index}]"},
                )
            sha256 = checked_sha(ref.get("sha256"), f"files[{index}].sha256")
            name = checked_name(ref.get("name"), f"files[{index}].name")
            with self._lock:
                if self._find(sha256, name) is None and sha256 not in missing:
                    missing.append(sha256)
        return missing

    def put(
        self,
        sha256: str,
        name: str,
        offset: int,
        size: int,
        final: bool,
        data: bytes,
        *,
        owner: str = "",
    ) -> Path | None:
        """Write ``data`` at ``offset`` of the file (``size`` bytes in all) that ``owner`` (a
        session) is sending; on ``final`` check its hash and keep it. Pieces come in order
        (``offset`` 0 starts over). Returns the kept file on ``final``, else None.

        A wrong offset or size, or bytes that do not hash to ``sha256`` (``reason``
        ``hash_mismatch``), raise InvalidRequest and leave nothing behind.
        """
        sha256, name = checked_sha(sha256, "sha256"), checked_name(name, "name")
        if not natural(size) or not natural(offset):
            raise InvalidRequest(
                f"put: expected a size and an offset >= 0, got {size!r} and {offset!r}",
                {"field": "size", "reason": "size"},
            )
        key = (owner, sha256, name)
        with self._lock:
            partial, written = self._partial.pop(key, (None, 0))
        try:
            if offset == 0:
                if partial is not None:
                    partial.unlink(missing_ok=True)
                (self.root / _PARTIAL).mkdir(parents=True, exist_ok=True)
                handle, text = tempfile.mkstemp(dir=self.root / _PARTIAL, suffix=".part")
                os.close(handle)
                partial, written = Path(text), 0
            if partial is None or offset != written:
                raise InvalidRequest(
                    f"put {name}: expected the bytes at offset {written}, got offset {offset}",
                    {"field": "offset", "reason": "offset", "expected": written},
                )
            if written + len(data) > size:
                raise InvalidRequest(
                    f"put {name}: {written + len(data)} bytes sent for a file of {size}",
                    {"field": "size", "reason": "size"},
                )
            with open(partial, "ab") as file:
                file.write(data)
            written += len(data)
            if not final:
                with self._lock:
                    self._partial[key] = (partial, written)
                return None
            return self._keep(partial, written, sha256, name, size)
        except BaseException:
            if partial is not None:
                partial.unlink(missing_ok=True)
            raise

    def discard(self, owner: str) -> None:
        """Delete what ``owner`` left half sent (its session closed)."""
        with self._lock:
            keys = [key for key in self._partial if key[0] == owner]
            paths = [self._partial.pop(key)[0] for key in keys]
        for path in paths:
            path.unlink(missing_ok=True)

    def path(self, ref: str, field: str = "params") -> Path:
        """The cached file or folder ``ref`` (``mizuoto-file:<sha256>/<name>``) names; a folder
        is rebuilt from its manifest on first use. InvalidRequest (``reason`` ``file_missing``)
        when the host has not sent it."""
        sha256, name = parse_ref(ref, field)
        with self._lock:
            found = self._find(sha256, name)
            if found is None and (self.root / sha256 / FOLDER_MANIFEST).is_file():
                found = self._assemble(sha256, name, field)
        if found is None:
            raise InvalidRequest(
                f"{field}: {ref} is not in the agent's file cache; send it (have, put) first",
                {"field": field, "reason": "file_missing", "sha256": sha256},
            )
        return found

    def collect(self, now: float | None = None, max_age: float = MAX_AGE) -> list[str]:
        """Delete the files (and half-sent pieces) unused for ``max_age`` seconds before
        ``now`` (default: the time now); the hashes deleted."""
        cutoff = (time.time() if now is None else now) - max_age
        deleted: list[str] = []
        if not self.root.is_dir():
            return deleted
        with self._lock:
            held = {partial for partial, _ in self._partial.values()}
            for entry in self.root.iterdir():
                try:
                    old = entry.stat().st_mtime < cutoff
                except FileNotFoundError:
                    continue
                if old and _SHA256.fullmatch(entry.name) and entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                    deleted.append(entry.name)
            for partial in (self.root / _PARTIAL).glob("*.part"):
                with contextlib.suppress(FileNotFoundError):
                    if partial not in held and partial.stat().st_mtime < cutoff:
                        partial.unlink()
        return sorted(deleted)

    def _keep(self, partial: Path, written: int, sha256: str, name: str, size: int) -> Path:
        if written != size:
            raise InvalidRequest(
                f"put {name}: the file ended after {written} of its {size} bytes",
                {"field": "size", "reason": "size"},
            )
        actual = sha256_file(partial)
        if actual != sha256:
            raise InvalidRequest(
                f"put {name}: its bytes hash to {actual}, not {sha256}; the file was not kept",
                {"field": "sha256", "reason": "hash_mismatch", "sha256": sha256, "got": actual},
            )
        if name == FOLDER_MANIFEST:
            _read_manifest(partial, "put")
        folder = self.root / sha256
        with self._lock:
            folder.mkdir(parents=True, exist_ok=True)
            os.replace(partial, folder / name)
            os.utime(folder)
        return folder / name

    def _find(self, sha256: str, name: str) -> Path | None:
        """The cached ``<sha256>/<name>`` (made from another name of the same bytes if need
        be), touched; None if the cache lacks those bytes. Under the lock."""
        folder = self.root / sha256
        target = folder / name
        if not target.exists() and name != FOLDER_MANIFEST:
            twin = next(
                (p for p in _files_in(folder) if p.name != FOLDER_MANIFEST),
                None,
            )
            if twin is not None:
                shutil.copyfile(twin, target)
        if not target.exists():
            return None
        os.utime(folder)
        return target

    def _assemble(self, sha256: str, name: str, field: str) -> Path | None:
        """Build the folder a manifest describes from the cached files; None if one is missing.
        Under the lock."""
        entries = _read_manifest(self.root / sha256 / FOLDER_MANIFEST, field)
        sources = []
        for path, file_sha in entries:
            source = next(iter(_files_in(self.root / file_sha)), None)
            if source is None:
                return None
            sources.append((path, source))
        staging = Path(tempfile.mkdtemp(dir=self.root / sha256, prefix=".mizuoto-"))
        try:
            for path, source in sources:
                (staging / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, staging / path)
                os.utime(source.parent)
            os.replace(staging, self.root / sha256 / name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        os.utime(self.root / sha256)
        return self.root / sha256 / name


def _read_manifest(path: Path, field: str) -> list[tuple[PurePosixPath, str]]:
    try:
        entries = json.loads(path.read_bytes())["files"]
        listed = [
            (relative_path(e["path"], field), checked_sha(e["sha256"], field)) for e in entries
        ]
    except (ValueError, KeyError, TypeError) as error:
        raise InvalidRequest(
            f"{field}: a folder manifest is not {{files: [{{path, sha256, size}}]}} ({error})",
            {"field": field, "reason": "manifest"},
        ) from None
    return listed


def _files_in(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_file())
    except (FileNotFoundError, NotADirectoryError):
        return []
