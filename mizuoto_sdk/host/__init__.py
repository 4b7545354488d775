"""The host: how the Mizuoto server (and the CLI) drive engines in this process."""

from mizuoto_sdk.host.local import LocalEngine, LocalHandle
from mizuoto_sdk.host.request import EngineRequest
from mizuoto_sdk.host.service import RuntimeService
from mizuoto_sdk.host.settings import Settings

__all__ = ["EngineRequest", "LocalEngine", "LocalHandle", "RuntimeService", "Settings"]
