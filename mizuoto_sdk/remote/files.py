"""Files by content: a path means nothing on another machine, so a file travels as its SHA-256.

A request param that names a local file becomes ``mizuoto-file:<sha256>/<name>``; one that names
a folder becomes ``mizuoto-file:<sha256 of its manifest>/<name>``. A folder's manifest is a
small JSON file (``FOLDER_MANIFEST``) listing every regular file under the folder as
``{"path": relative posix path, "sha256", "size"}``, sorted by path and written with sorted keys
and no spaces, so the same folder always has the same hash. The host sends the manifest and each
of the folder's files like any other file (a file under its base name); the agent rebuilds the
folder from them the first time a request names it.

``FileCache`` is the agent's side: ``have`` says which files it lacks, ``put`` receives them in
pieces (checked against their hash before they are kept), ``path`` turns a reference into the
cached file or folder, and ``collect`` deletes what no host asked for in 30 days. The cache keeps
``<root>/<sha256>/<name>``; nothing outside ``root`` is ever read or written for a host.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.remote.wire import FILE_CHUNK

__all__ = [
    "FILE_SCHEME",
    "FOLDER_MANIFEST",
    "MAX_AGE",
    "FileCache",
    "Upload",
    "file_ref",
    "folder_files",
    "folder_manifest",
    "format_ref",
    "parse_ref",
    "put_frames",
    "relative_path",
    "sha256_file",
    "upload_for",
]

FILE_SCHEME = "mizuoto-file:"
FOLDER_MANIFEST = ".mizuoto-folder.json"
"""The name a folder's manifest travels and is kept under."""
MAX_AGE = 30 * 24 * 3600.0
"""Seconds a cached file stays after a host last asked for it (30 days)."""

_SHA256 = re.compile(r"[0-9a-f]{64}")
_PARTIAL = ".partial"
FileRef = dict[str, object]
"""``{"sha256", "name", "size"}``: one file as ``have`` lists it."""


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def file_ref(path: str | os.PathLike[str]) -> FileRef:
    """``{"sha256", "name", "size"}`` of a local file (``name``: its base name)."""
    path = Path(path)
    return {"sha256": sha256_file(path), "name": path.name, "size": path.stat().st_size}


def format_ref(sha256: str, name: str) -> str:
    """``mizuoto-file:<sha256>/<name>``."""
    return f"{FILE_SCHEME}{_checked_sha(sha256, 'sha256')}/{_checked_name(name, 'name')}"


def parse_ref(value: str, field: str = "params") -> tuple[str, str]:
    """``(sha256, name)`` of a ``mizuoto-file:`` reference; InvalidRequest naming ``field``."""
    if not isinstance(value, str) or not value.startswith(FILE_SCHEME):
        raise InvalidRequest(
            f"{field}: expected {FILE_SCHEME}<sha256>/<name>, got {value!r}",
            {"field": field, "reason": "file_ref"},
        )
    sha256, _, name = value[len(FILE_SCHEME) :].partition("/")
    return _checked_sha(sha256, field), _checked_name(name, field)


def relative_path(value: object, field: str) -> PurePosixPath:
    """``value`` as a relative posix path inside a folder (no ``..``, not absolute, each part a
    plain name); InvalidRequest naming ``field`` otherwise. For names a peer sends."""
    if not isinstance(value, str) or not value or value.startswith("/"):
        raise InvalidRequest(
            f"{field}: expected a relative path inside the folder, got {value!r}",
            {"field": field, "reason": "path"},
        )
    path = PurePosixPath(value)
    for part in path.parts:
        _checked_name(part, field)
    return path


def folder_files(folder: str | os.PathLike[str]) -> Iterator[tuple[str, Path]]:
    """Every regular file under ``folder`` as ``(relative posix path, path)``, sorted by path."""
    root = Path(folder)
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            if path.is_file():
                found.append((path.relative_to(root).as_posix(), path))
    yield from sorted(found)


def folder_manifest(folder: str | os.PathLike[str]) -> tuple[bytes, list[tuple[FileRef, Path]]]:
    """A folder's manifest (its bytes) and each of its files' ref (under its base name)."""
    entries, files = [], []
    for relative, path in folder_files(folder):
        ref = file_ref(path)
        entries.append({"path": relative, "sha256": ref["sha256"], "size": ref["size"]})
        files.append((ref, path))
    manifest = json.dumps({"files": entries}, sort_keys=True, separators=(",", ":")).encode()
    return manifest, files


@dataclass(frozen=True)
class Upload:
    """What a host sends for one path param: ``value`` replaces the path in the request;
    ``files`` are what ``have`` lists, each with its bytes (a path, or the manifest's bytes)."""

    value: str
    files: tuple[tuple[FileRef, Path | bytes], ...]


def upload_for(path: str | os.PathLike[str]) -> Upload:
    """The reference and the files for a local file or folder."""
    path = Path(path)
    if not path.is_dir():
        ref = file_ref(path)
        return Upload(format_ref(str(ref["sha256"]), path.name), ((ref, path),))
    manifest, files = folder_manifest(path)
    sha256 = hashlib.sha256(manifest).hexdigest()
    manifest_ref: FileRef = {"sha256": sha256, "name": FOLDER_MANIFEST, "size": len(manifest)}
    return Upload(format_ref(sha256, path.name), ((manifest_ref, manifest), *files))


def put_frames(
    ref: Mapping[str, object], source: Path | bytes, chunk: int = FILE_CHUNK
) -> Iterator[tuple[dict[str, object], bytes]]:
    """The ``put`` frames (header, bytes) that send one file: ``size`` is the whole file's,
    ``offset`` where these bytes go; the last one says ``final``. An empty file is one frame."""
    size = int(ref["size"])  # type: ignore[call-overload]  # a FileRef's size is an int
    header = {"sha256": ref["sha256"], "name": ref["name"], "size": size}
    with contextlib.ExitStack() as stack:
        reader = None if isinstance(source, bytes) else stack.enter_context(open(source, "rb"))
        offset = 0
        while True:
            if reader is None:
                assert isinstance(source, bytes)
                data = source[offset : offset + chunk]
            else:
                data = reader.read(chunk)
            final = offset + len(data) >= size or not data
            yield {**header, "offset": offset, "final": final}, data
            offset += len(data)
            if final:
                return


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
            sha256 = _checked_sha(ref.get("sha256"), f"files[{index}].sha256")
            name = _checked_name(ref.get("name"), f"files[{index}].name")
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
        sha256, name = _checked_sha(sha256, "sha256"), _checked_name(name, "name")
        if not _natural(size) or not _natural(offset):
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
            (relative_path(e["path"], field), _checked_sha(e["sha256"], field)) for e in entries
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


def _checked_sha(value: object, field: str) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise InvalidRequest(
            f"{field}: expected a SHA-256 as 64 lowercase hex digits, got {value!r}",
            {"field": field, "reason": "sha256"},
        )
    return value


def _checked_name(value: object, field: str) -> str:
    if (
        not isinstance(value, str)
        or value in ("", ".", "..")
        or any(c in value for c in "/\\\0")
        or len(value.encode(errors="replace")) > 255
    ):
        raise InvalidRequest(
            f"{field}: expected a file name (no slashes, not . or ..), got {value!r}",
            {"field": field, "reason": "name"},
        )
    return value


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
