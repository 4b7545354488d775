"""discovery.import_cheap: this entry-point module imports torch (distribution of its own)."""

from __future__ import annotations

import torch  # noqa: F401 - the breakage: listing engines now imports torch

from mizuoto_broken.manifests import BASE, broken
from mizuoto_sdk import EngineManifest, hookimpl


@hookimpl
def mizuoto_engines() -> list[EngineManifest]:
    return [broken("discovery.import_cheap", BASE)]
