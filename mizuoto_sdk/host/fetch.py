"""Getting one model file onto the disk: over HTTP (resuming with a Range request), or out of the
Hugging Face Hub's own cache through ``huggingface_hub``, and checking what arrived.

Nothing here decides where a model lives or when it counts as installed (``host/models.py``
does); a failure is a ``ModelNotInstalled`` naming the file, what went wrong and the fix.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from mizuoto_sdk.errors import ModelNotInstalled
from mizuoto_sdk.manifest import HubSource, ModelFile

CHUNK = 1 << 20
TIMEOUT_S = 30.0

Advance = Callable[[int], None]
"""Told the number of bytes that just arrived."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def check_file(path: Path, file: ModelFile, digest: bool) -> str | None:
    """What is wrong with ``path`` as ``file`` (None: nothing); sha256 only when ``digest``."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{file.path}: missing"
    if size != file.size:
        return f"{file.path}: {size} bytes, expected {file.size}"
    if digest and (found := sha256_of(path)) != file.sha256:
        return f"{file.path}: sha256 {found}, expected {file.sha256}"
    return None


def download(url: str, target: Path, file: ModelFile, advance: Advance, fail: Fail) -> None:
    """Bring ``target`` up to ``file.size`` bytes from ``url``, going on from what it holds.

    A server that ignores the Range header sends the whole file again: it is written from the
    start. What arrived stays on the disk when the transfer stops, for the next pull to resume.
    """
    # Imported here: every host import reads this module, only a pull downloads.
    import http.client
    import urllib.error
    import urllib.request

    have = target.stat().st_size if target.exists() else 0
    if have > file.size:
        target.unlink()
        have = 0
    if have == file.size:
        return
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            if have and response.status != 206:
                have = 0
            with target.open("ab" if have else "wb") as out:
                while block := response.read(CHUNK):
                    have += len(block)
                    if have > file.size:
                        raise fail(f"{url} sends more than the {file.size} bytes declared")
                    out.write(block)
                    advance(len(block))
    except urllib.error.HTTPError as error:
        raise fail(f"{url} answered HTTP {error.code} {error.reason}") from None
    except (OSError, http.client.HTTPException) as error:
        reason = getattr(error, "reason", None) or error
        raise fail(
            f"the download of {url} stopped after {have} of {file.size} bytes ({reason}); "
            "pull again to resume"
        ) from None
    if have < file.size:
        raise fail(
            f"{url} ended after {have} of {file.size} bytes; pull again to resume",
        )


def from_hub(source: HubSource, file: ModelFile, target: Path, fail: Fail) -> None:
    """Put the Hub file at ``target``: fetched into the Hub cache (HF_HOME, HF_HUB_OFFLINE are
    honoured), then linked (or copied, across file systems) into the model's folder."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise fail(
            "this model comes from the Hugging Face Hub; install huggingface_hub: "
            "pip install 'mizuoto-sdk[hub]'",
            "hub_missing",
        ) from None
    try:
        cached = Path(
            hf_hub_download(repo_id=source.repo, filename=file.path, revision=source.revision)
        ).resolve()
    except Exception as error:  # huggingface_hub's errors share no base class beyond Exception
        raise fail(
            f"{source.repo}@{source.revision[:12]} {file.path}: {type(error).__name__}: {error}"
        ) from None
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        target.unlink()
    try:
        os.link(cached, target)
    except OSError:
        shutil.copyfile(cached, target)


class Fail:
    """Builds the pull's error: ``fail(why)`` -> ModelNotInstalled with the engine, model and
    the command that retries."""

    def __init__(self, engine_id: str, model_id: str, command: str) -> None:
        self.engine_id, self.model_id, self.command = engine_id, model_id, command

    def __call__(self, why: str, reason: str = "download_failed") -> ModelNotInstalled:
        return ModelNotInstalled(
            f"model {self.model_id!r} of engine {self.engine_id!r} was not installed: {why}",
            {
                "engine": self.engine_id,
                "model": self.model_id,
                "reason": reason,
                "command": self.command,
            },
        )
