"""Where ``EngineRequest`` was defined; it lives in ``mizuoto_sdk.request`` now."""

from mizuoto_sdk.request import EngineRequest, ProgressCallback

__all__ = ["EngineRequest", "ProgressCallback"]
