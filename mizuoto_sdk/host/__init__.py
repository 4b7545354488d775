"""The host: how the Mizuoto server (and the CLI) drive engines in this process.

Finding engines (``discover``, ``Discovery``, ``EngineRecord``, ``get_engine``) and turning a
wire error code back into its exception (``error_from_code``) are host work, so they are
imported from here. Importing this package never imports torch.
"""

from mizuoto_sdk.discovery import Discovery, EngineRecord, discover, get_engine
from mizuoto_sdk.errors import error_from_code
from mizuoto_sdk.host.local import LocalEngine
from mizuoto_sdk.host.model import LocalModel
from mizuoto_sdk.host.service import RuntimeService
from mizuoto_sdk.host.settings import Settings
from mizuoto_sdk.request import EngineRequest

__all__ = [
    "Discovery",
    "EngineRecord",
    "EngineRequest",
    "LocalEngine",
    "LocalModel",
    "RuntimeService",
    "Settings",
    "discover",
    "error_from_code",
    "get_engine",
]


def __getattr__(name: str) -> object:
    """Names renamed in this release, with their warning (see ``local.__getattr__``)."""
    from mizuoto_sdk.host import local

    if name == "LocalHandle":
        return local.__getattr__(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
