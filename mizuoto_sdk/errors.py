"""Errors an engine raises and the host reports.

Every error the host hands back carries a code from one closed registry, so that a server, a CLI
and a contract suite can act on the code without parsing messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType


class EngineError(Exception):
    """An error with a stable code and a JSON-friendly detail mapping.

    Engines raise it (or a subclass) for anything a caller can act on; the host adds the engine id
    and device to ``detail`` before handing it on.
    """

    code = "engine_error"

    def __init__(
        self, message: str, detail: Mapping[str, object] | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        if code is not None:
            if code not in ERROR_CODES:
                known = ", ".join(sorted(ERROR_CODES))
                raise ValueError(f"unknown error code {code!r}; known codes: {known}")
            self.code = code
        self.message = message
        self.detail: dict[str, object] = dict(detail or {})

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "detail": dict(self.detail)}


class InvalidRequest(EngineError):
    """The request itself is wrong: put the offending field in ``detail["field"]``."""

    code = "invalid_request"


class Unsupported(EngineError):
    """The engine does not have the capability that was asked for."""

    code = "capability_not_supported"


class ComputeUnavailable(EngineError):
    """The device cannot run the request now (out of memory, device missing)."""

    code = "compute_unavailable"


class CancelledError(EngineError):
    """The caller cancelled the call; the engine stopped at its next ``ctx.check_cancel()``."""

    code = "cancelled"


class OperationTimeoutError(EngineError):
    """The call ran past its timeout and was cancelled."""

    code = "operation_timeout"


class WorkerFailed(EngineError):
    """The process or replica that ran the engine is gone; the request itself may be fine."""

    code = "worker_failed"


class EngineNotFound(EngineError):
    """No installed plugin provides an engine with that id."""

    code = "engine_not_found"


class EngineUnavailable(EngineError):
    """The engine is known but cannot be used: its plugin failed, conflicts or is incompatible."""

    code = "engine_unavailable"


class ModelNotInstalled(EngineError):
    """The model's files are missing or damaged; the message names the command that installs
    them (``detail["command"]``) and ``detail["reason"]`` says what was wrong."""

    code = "model_not_installed"


ERROR_CODES: Mapping[str, str] = MappingProxyType(
    {
        "engine_error": "the engine failed; detail holds the exception name and traceback",
        "invalid_request": "the request is malformed; detail['field'] names what is wrong",
        "capability_not_supported": "the engine does not implement the requested capability",
        "compute_unavailable": "the device cannot run the request (detail['reason'] says why)",
        "cancelled": "the caller cancelled the call",
        "operation_timeout": "the call exceeded its timeout",
        "worker_failed": "the worker running the engine died",
        "engine_not_found": "no installed plugin provides this engine id",
        "engine_unavailable": "the engine's plugin failed to load, conflicts or is incompatible",
        "model_not_installed": "the model's files are missing or damaged; detail['command'] "
        "installs them",
    }
)

_CLASSES: Mapping[str, type[EngineError]] = MappingProxyType(
    {
        cls.code: cls
        for cls in (
            EngineError,
            InvalidRequest,
            Unsupported,
            ComputeUnavailable,
            CancelledError,
            OperationTimeoutError,
            WorkerFailed,
            EngineNotFound,
            EngineUnavailable,
            ModelNotInstalled,
        )
    }
)


def error_from_code(
    code: str, message: str, detail: Mapping[str, object] | None = None
) -> EngineError:
    """Build the error class registered for ``code`` (e.g. when it crossed a process boundary)."""
    if code not in ERROR_CODES:
        known = ", ".join(sorted(ERROR_CODES))
        raise ValueError(f"unknown error code {code!r}; known codes: {known}")
    return _CLASSES[code](message, detail)
