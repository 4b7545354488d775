"""Mizuoto engine SDK: what an engine author imports.

Everything promised is exported here; importing it never imports torch.
"""

from mizuoto_sdk.discovery import Discovery, EngineRecord, discover, get_engine
from mizuoto_sdk.engine import Engine, LoadedEngine
from mizuoto_sdk.errors import (
    ERROR_CODES,
    CancelledError,
    ComputeUnavailable,
    EngineError,
    EngineNotFound,
    EngineUnavailable,
    InvalidRequest,
    OperationTimeoutError,
    Unsupported,
    WorkerFailed,
    error_from_code,
)
from mizuoto_sdk.hooks import hookimpl
from mizuoto_sdk.manifest import API_VERSION, EngineManifest, ModelEntry
from mizuoto_sdk.types import AudioChunk, LoadSpec

__all__ = [
    "API_VERSION",
    "ERROR_CODES",
    "AudioChunk",
    "CancelledError",
    "ComputeUnavailable",
    "Discovery",
    "Engine",
    "EngineError",
    "EngineManifest",
    "EngineNotFound",
    "EngineRecord",
    "EngineUnavailable",
    "InvalidRequest",
    "LoadSpec",
    "LoadedEngine",
    "ModelEntry",
    "OperationTimeoutError",
    "Unsupported",
    "WorkerFailed",
    "discover",
    "error_from_code",
    "get_engine",
    "hookimpl",
]
