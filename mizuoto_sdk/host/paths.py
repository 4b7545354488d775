"""Checking a folder the host is about to create, before an engine spends time filling it.

``prepare_voice`` writes into a staging folder and renames it onto the target only when the engine
succeeds. Everything that could stop that rename (a link that leads nowhere, a file or a non-empty
folder in the way, a parent that cannot be created or written) is found here, before the engine
runs, and reported as ``invalid_request`` naming the target, never as a raw ``OSError`` after
minutes of work.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from mizuoto_sdk.errors import InvalidRequest

STAGING_PREFIX = ".mizuoto-"  # short, so that any name the file system accepts can be staged


def staged_folder(target: Path, field: str) -> tuple[Path, Path]:
    """``(folder, staging)``: where the result goes, and an empty folder beside it to fill first.

    A symbolic link to an empty folder stands for that folder: the result goes where the link
    points and the link stays. The staging folder sits in the same parent as the result, so that
    the final ``os.replace`` is a rename on one file system.
    """

    def invalid(problem: str) -> InvalidRequest:
        return InvalidRequest(f"{field}: {target} {problem}", {"field": field, "path": str(target)})

    folder = target
    if target.is_symlink():
        try:
            folder = target.resolve(strict=True)
        except (OSError, RuntimeError):  # RuntimeError: a loop, before Python 3.13
            raise invalid(
                "is a symbolic link that leads nowhere (dangling, or a loop); remove it or give "
                "another folder"
            ) from None
    try:
        if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            raise invalid("already exists and is not an empty folder")
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, suffix=".part", dir=folder.parent)
    except OSError as error:
        raise invalid(f"cannot be written: {error.strerror or error}") from None
    return folder, Path(staging)
