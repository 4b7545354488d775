"""discovery.import_cheap, in the hook: importing this entry-point module is cheap, but its hook
imports torch to build the manifests (distribution of its own: mizuoto-broken-import-cheap)."""

from __future__ import annotations

from mizuoto_broken.manifests import BASE, broken
from mizuoto_sdk import EngineManifest, hookimpl


@hookimpl
def mizuoto_engines() -> list[EngineManifest]:
    import torch  # noqa: F401 - the breakage: listing engines now imports torch

    return [broken("discovery.import_cheap", BASE, variant="hook")]
