"""Files by content: a path means nothing on another machine, so a file travels as its SHA-256.

A request param that names a local file becomes ``mizuoto-file:<sha256>/<name>``; one that names
a folder becomes ``mizuoto-file:<sha256 of its manifest>/<name>``. A folder's manifest is a
small JSON file (``FOLDER_MANIFEST``) listing every regular file under the folder as
``{"path": relative posix path, "sha256", "size"}``, sorted by path and written with sorted keys
and no spaces, so the same folder always has the same hash. The host sends the manifest and each
of the folder's files like any other file (a file under its base name); the agent rebuilds the
folder from them the first time a request names it.

The agent keeps what arrives in its ``FileCache`` (``remote/cache.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.remote.wire import FILE_CHUNK

__all__ = [
    "FILE_SCHEME",
    "FOLDER_MANIFEST",
    "MAX_AGE",
    "Upload",
    "checked_name",
    "checked_sha",
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
    return f"{FILE_SCHEME}{checked_sha(sha256, 'sha256')}/{checked_name(name, 'name')}"


def parse_ref(value: str, field: str = "params") -> tuple[str, str]:
    """``(sha256, name)`` of a ``mizuoto-file:`` reference; InvalidRequest naming ``field``."""
    if not isinstance(value, str) or not value.startswith(FILE_SCHEME):
        raise InvalidRequest(
            f"{field}: expected {FILE_SCHEME}<sha256>/<name>, got {value!r}",
            {"field": field, "reason": "file_ref"},
        )
    sha256, _, name = value[len(FILE_SCHEME) :].partition("/")
    return checked_sha(sha256, field), checked_name(name, field)


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
        checked_name(part, field)
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


def checked_sha(value: object, field: str) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise InvalidRequest(
            f"{field}: expected a SHA-256 as 64 lowercase hex digits, got {value!r}",
            {"field": field, "reason": "sha256"},
        )
    return value


def checked_name(value: object, field: str) -> str:
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


def natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
