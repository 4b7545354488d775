"""Where engine code failed: the innermost frame of the engine's own files in a traceback.

An engine's exception usually reaches a check wrapped by the host (an EngineError raised from
it), so the frames of the original are found by following ``__cause__`` and ``__context__``.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _inside(filename: str, roots: Sequence[Path]) -> bool:
    try:
        path = Path(filename).resolve()
    except (OSError, ValueError):
        return False
    return any(path == root or root in path.parents for root in roots)


def engine_frame(error: BaseException, roots: Sequence[Path]) -> str | None:
    """``file:line in function`` of the innermost engine frame, searching the chain from the
    original exception outwards; None when no frame lies in ``roots``."""
    for exception in reversed(list(_chain(error))):
        frames = traceback.extract_tb(exception.__traceback__)
        for frame in reversed(frames):
            if _inside(frame.filename, roots):
                return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return None


def short_traceback(error: BaseException, limit: int = 3) -> str:
    """The last ``limit`` frames and the message of the original exception of the chain."""
    original = list(_chain(error))[-1]
    return "".join(traceback.format_exception(original)[-(limit + 1) :])


def generator_frame(generator: object, roots: Sequence[Path]) -> str | None:
    """``file:line in function`` where a suspended generator (or the innermost one it delegates
    to with ``yield from``) that lies in ``roots`` is paused: the engine's yield."""
    found = None
    current = generator
    while current is not None:
        frame = getattr(current, "gi_frame", None)
        if frame is not None and _inside(frame.f_code.co_filename, roots):
            found = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        current = getattr(current, "gi_yieldfrom", None)
    return found
