"""Optional packages behind the text blocks, and the one error their absence raises."""

from __future__ import annotations

import importlib
from types import ModuleType

from mizuoto_sdk.errors import EngineUnavailable

# import name -> (pip requirement, the mizuoto-sdk extra that installs it)
EXTRAS = {
    "tokenizers": ("tokenizers>=0.20", "text"),
    "jinja2": ("jinja2>=3.1.6", "text"),
    "tiktoken": ("tiktoken>=0.7", "tiktoken"),
    "wetext": ("wetext>=0.1.8", "wetext"),
}


class MissingExtra(EngineUnavailable, ImportError):
    """A text block needs a package that is not installed.

    The operator fixes it by installing the extra, so the host reports ``engine_unavailable``
    with ``detail["extra"]`` and ``detail["package"]``; ``ImportError`` stays a base so code
    that already catches a failed import keeps working.
    """

    def __init__(self, module: str, feature: str) -> None:
        requirement, extra = EXTRAS[module]
        super().__init__(
            f"{feature} needs the package {module!r}, which is not installed; install it with "
            f"pip install 'mizuoto-sdk[{extra}]' (or pip install '{requirement}')",
            {"reason": "missing_extra", "extra": extra, "package": requirement},
        )
        self.module = module
        self.extra = extra


def require(module: str, feature: str) -> ModuleType:
    """``module`` imported, or MissingExtra naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:  # the package, or one it needs: the extra installs both
        raise MissingExtra(module, feature) from error
