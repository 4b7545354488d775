"""How the server's answers look: errors in one shape without the engine's traceback, and never the
data folder's path.

A client may learn where a voice lies inside the data folder, not where the data folder lies on
the server's disk: wherever an answer (an error's message or detail, a result) holds that path,
it reads ``HIDDEN`` instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fastapi.responses import JSONResponse

from mizuoto_sdk.errors import EngineError

HIDDEN = "<data folder>"
"""What an answer says in place of the data folder's path."""


def public_error(error: BaseException) -> dict[str, Any]:
    """An error as the API shows it: its code, message and detail, never the engine's traceback
    (that stays in the server's log)."""
    if not isinstance(error, EngineError):
        return {"code": "engine_error", "message": str(error), "detail": {}}
    detail = {k: v for k, v in error.detail.items() if k != "traceback"}
    shown: dict[str, Any] = jsonable(
        {"code": error.code, "message": error.message, "detail": detail}
    )
    return shown


def answer_class(home: Path) -> type[JSONResponse]:
    """The class of JSON answers in which ``home``, the data folder, reads ``HIDDEN``."""
    paths = {os.fspath(home), os.fspath(home.resolve())}
    hidden = sorted(paths, key=len, reverse=True)  # the longer first: one may contain the other

    def hide(value: Any) -> Any:
        if isinstance(value, str):
            for path in hidden:
                value = value.replace(path, HIDDEN)
            return value
        if isinstance(value, dict):
            return {hide(key): hide(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [hide(item) for item in value]
        return value

    class Answer(JSONResponse):
        def render(self, content: Any) -> bytes:
            return super().render(hide(content))

    return Answer


def jsonable(value: Any) -> Any:
    """``value`` with what JSON cannot hold (paths, numpy numbers) as text."""
    return json.loads(json.dumps(value, default=str))
