"""Engines that declare expected contract failures (distribution mizuoto-broken-expected).

The CLI's and the pytest helper's tests run them: a declared failure that fails is xfail, one
that passes is xpass, and an id that names no check is a usage error.
"""

from __future__ import annotations

from mizuoto_broken.manifests import BASE, manifest
from mizuoto_sdk import EngineManifest, hookimpl

DESCRIBE_BROKEN = "mizuoto_broken.load_describe_json:Engine"


@hookimpl
def mizuoto_engines() -> list[EngineManifest]:
    return [
        manifest(
            "expects-describe-fails",
            DESCRIBE_BROKEN,
            expected_failures={"load.describe_json": "describe() holds a torch.device"},
        ),
        manifest(
            "expects-describe-passes",
            BASE,
            expected_failures={"load.describe_json": "declared, but describe() is fine"},
        ),
        manifest(
            "expects-unknown-check",
            BASE,
            expected_failures={"load.no_such_check": "a misspelled check id"},
        ),
    ]
