"""discovery.register_twice: the hook numbers its calls in the description (own distribution)."""

from __future__ import annotations

import itertools

from mizuoto_broken.manifests import BASE, broken
from mizuoto_sdk import EngineManifest, hookimpl

_CALLS = itertools.count(1)


@hookimpl
def mizuoto_engines() -> list[EngineManifest]:
    # The breakage: state kept between calls makes each discovery see another manifest.
    return [broken("discovery.register_twice", BASE, description=f"call {next(_CALLS)}")]
