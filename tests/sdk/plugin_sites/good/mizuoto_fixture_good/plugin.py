"""Declares engine ``good``: models a, b, c; three capabilities; CPU only."""

from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl


@hookimpl
def mizuoto_engines():
    return [
        EngineManifest(
            id="good",
            implementation="mizuoto_fixture_good.engine:Good",
            models=[ModelEntry("a"), ModelEntry("b"), ModelEntry("c")],
            capabilities=["synthesize", "prepare_voice", "call"],
            devices=["cpu"],
        )
    ]
