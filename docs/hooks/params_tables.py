"""mkdocs hook: a page's ``<!-- params: ENGINE -->`` becomes the table of that engine's request
params, read from its installed manifest, so the docs say what the host checks."""

from __future__ import annotations

import json
import re
from typing import Any

from mkdocs.exceptions import PluginError

from mizuoto_sdk import Param
from mizuoto_sdk.host import Discovery
from mizuoto_sdk.params import HOST_PARAMS

MARKER = re.compile(r"<!-- params: ([a-z][a-z0-9_-]*) -->")


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER.search(markdown) is None:
        return markdown
    discovery = Discovery()
    return MARKER.sub(lambda match: table(discovery, match[1], page.file.src_uri), markdown)


def table(discovery: Discovery, engine_id: str, where: str) -> str:
    record = next((r for r in discovery.records() if r.id == engine_id), None)
    if record is None or record.manifest is None:
        raise PluginError(
            f"{where}: <!-- params: {engine_id} --> names an engine that is not installed "
            "(pip install -e its plugin folder)"
        )
    rows = ["| param | type | default | allowed | meaning |", "| --- | --- | --- | --- | --- |"]
    for param in (*record.manifest.params, *HOST_PARAMS):
        help_text = param.help + (" (the host's own)" if param in HOST_PARAMS else "")
        cells = [
            f"`{param.name}`",
            param.type,
            "none" if param.default is None else f"`{json.dumps(param.default)}`",
            _allowed(param),
            help_text.replace("|", "\\|"),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _allowed(param: Param) -> str:
    if param.choices is not None:
        return ", ".join(f"`{json.dumps(choice)}`" for choice in param.choices)
    if param.minimum is not None and param.maximum is not None:
        return param.range_text() or ""
    if param.minimum is not None or param.maximum is not None:
        return param.expected().split(" ", 2)[2]  # "an integer >= 1" -> ">= 1"
    return "any"
