"""Declares engine ``two`` (distribution Mizuoto_Fixture_Two, spelt so on purpose)."""

from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl


@hookimpl
def mizuoto_engines():
    return [
        EngineManifest(
            id="two",
            implementation="mizuoto_fixture_one:Good",
            models=[ModelEntry("a"), ModelEntry("b"), ModelEntry("c")],
            capabilities=["synthesize", "prepare_voice", "call"],
            devices=["cpu"],
        )
    ]
