"""discovery.api_compatible: declares a future engine API major (distribution of its own).

Discovery logs a warning naming the distribution of an incompatible plugin, so this one has its
own rather than make mizuoto-broken look incompatible.
"""

from __future__ import annotations

from mizuoto_broken.manifests import BASE, broken
from mizuoto_sdk import EngineManifest, hookimpl


@hookimpl
def mizuoto_engines() -> list[EngineManifest]:
    return [broken("discovery.api_compatible", BASE, api_version="2.0")]  # the breakage
