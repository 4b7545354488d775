"""Mizuoto engine SDK: what an engine author imports.

Everything promised is exported here, every type an engine's signatures name included
(``RequestContext``, ``Runtime``, ``ModelHandle``); importing it never imports torch. Those three
come from ``mizuoto_runtime`` and are resolved on first use (PEP 562), so the import stays cheap.
The host's names (``Discovery``, ``EngineRecord``, ``discover``, ``get_engine``,
``error_from_code``) live in ``mizuoto_sdk.host``; their old spellings here still work for one
release and warn (DeprecationWarning) with the new spelling.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import TYPE_CHECKING

from mizuoto_sdk.compute import ComputeSettings
from mizuoto_sdk.engine import Engine, LoadedEngine
from mizuoto_sdk.errors import (
    ERROR_CODES,
    CancelledError,
    ComputeUnavailable,
    EngineError,
    EngineNotFound,
    EngineUnavailable,
    InvalidRequest,
    ModelNotInstalled,
    OperationTimeoutError,
    Unsupported,
    WorkerFailed,
)
from mizuoto_sdk.hooks import hookimpl
from mizuoto_sdk.manifest import (
    API_VERSION,
    EngineManifest,
    FolderSource,
    HubSource,
    Library,
    ModelEntry,
    ModelFile,
    PackageSource,
    Program,
    UrlSource,
)
from mizuoto_sdk.parallel import (
    AttentionParallelConfig,
    DenseParallelConfig,
    MoeParallelConfig,
    OuterParallelConfig,
    ParallelConfig,
)
from mizuoto_sdk.params import Param
from mizuoto_sdk.types import AudioChunk, LoadSpec

if TYPE_CHECKING:
    from mizuoto_runtime import ModelHandle, RequestContext, Runtime
    from mizuoto_sdk.host import Discovery as Discovery
    from mizuoto_sdk.host import EngineRecord as EngineRecord
    from mizuoto_sdk.host import discover as discover
    from mizuoto_sdk.host import error_from_code as error_from_code
    from mizuoto_sdk.host import get_engine as get_engine

__all__ = [
    "API_VERSION",
    "ERROR_CODES",
    "AttentionParallelConfig",
    "AudioChunk",
    "CancelledError",
    "ComputeSettings",
    "ComputeUnavailable",
    "DenseParallelConfig",
    "Engine",
    "EngineError",
    "EngineManifest",
    "EngineNotFound",
    "EngineUnavailable",
    "FolderSource",
    "HubSource",
    "InvalidRequest",
    "Library",
    "LoadSpec",
    "LoadedEngine",
    "ModelEntry",
    "ModelFile",
    "ModelHandle",
    "ModelNotInstalled",
    "MoeParallelConfig",
    "OperationTimeoutError",
    "OuterParallelConfig",
    "PackageSource",
    "ParallelConfig",
    "Param",
    "Program",
    "RequestContext",
    "Runtime",
    "Unsupported",
    "UrlSource",
    "WorkerFailed",
    "hookimpl",
]

_FROM_RUNTIME = frozenset({"ModelHandle", "RequestContext", "Runtime"})
# Old spelling -> where it lives now. Removed in the release after the one that moved them.
_MOVED = {
    "Discovery": "mizuoto_sdk.host",
    "EngineRecord": "mizuoto_sdk.host",
    "discover": "mizuoto_sdk.host",
    "error_from_code": "mizuoto_sdk.host",
    "get_engine": "mizuoto_sdk.host",
}


# Type checkers read the names imported under TYPE_CHECKING above; a module __getattr__
# would make every misspelt name type-check, so they never see it.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        """Resolve the runtime's types on first use, and the moved host names with a warning."""
        if name in _FROM_RUNTIME:
            value = getattr(importlib.import_module("mizuoto_runtime"), name)
            globals()[name] = value
            return value
        where = _MOVED.get(name)
        if where is not None:
            if sys._getframe(1).f_globals.get("__name__") != "importlib._bootstrap":
                # ``from mizuoto_sdk import x`` asks twice (importlib's hasattr, then the import
                # itself): one warning, at the caller's line.
                warnings.warn(
                    f"mizuoto_sdk.{name} is deprecated and goes in the next release; "
                    f"use {where}.{name} (from {where} import {name})",
                    DeprecationWarning,
                    stacklevel=2,
                )
            return getattr(importlib.import_module(where), name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
