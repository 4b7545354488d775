"""What a caller sees when engine code fails: always an ``EngineError`` with a code.

The engine's own ``EngineError`` keeps its code and gains the engine and device in its detail;
out of memory is ``compute_unavailable`` (``reason: out_of_memory``), listing what the host
released before answering; anything else is ``engine_error`` with the exception's name and
traceback. Freeing memory is the caller's decision, made before it asks for the error.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence

from mizuoto_runtime.devices.device import is_oom
from mizuoto_sdk.errors import ComputeUnavailable, EngineError


def engine_failure(
    error: BaseException, engine_id: str, device: str, released: Sequence[str] = ()
) -> EngineError:
    """The coded error for ``error`` raised by engine ``engine_id`` on ``device``.

    An ``EngineError`` is returned itself, with ``engine`` and ``device`` added to its detail,
    so that ``raise`` keeps its traceback; ``released`` names the models freed after an
    out-of-memory error.
    """
    where = {"engine": engine_id, "device": device}
    if isinstance(error, EngineError):
        error.detail = {**error.detail, **where}
        return error
    if is_oom(error):
        return ComputeUnavailable(
            f"{engine_id} ran out of memory on {device}: {error}",
            {
                "reason": "out_of_memory",
                **where,
                "exception": type(error).__name__,
                "released": list(released),
            },
        )
    return EngineError(
        f"{engine_id} failed on {device}: {type(error).__name__}: {error}",
        {
            **where,
            "exception": type(error).__name__,
            "traceback": "".join(traceback.format_exception(error)),
        },
    )
