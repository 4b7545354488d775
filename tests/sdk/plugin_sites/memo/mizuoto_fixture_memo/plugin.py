"""Declares engine ``memo``: models a and b; CPU only."""

from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl


@hookimpl
def mizuoto_engines():
    return [
        EngineManifest(
            id="memo",
            implementation="mizuoto_fixture_memo.engine:MemoEngine",
            models=[ModelEntry("a"), ModelEntry("b")],
            capabilities=["synthesize"],
            devices=["cpu"],
        )
    ]
