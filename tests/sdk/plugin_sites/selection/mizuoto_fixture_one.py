"""Declares engine ``one`` (distribution mizuoto-fixture-one)."""

from mizuoto_sdk import Engine, EngineManifest, ModelEntry, hookimpl


class Good(Engine):
    DEVICES = ("cpu",)


@hookimpl
def mizuoto_engines():
    return [
        EngineManifest(
            id="one",
            implementation="mizuoto_fixture_one:Good",
            models=[ModelEntry("a"), ModelEntry("b"), ModelEntry("c")],
            capabilities=["synthesize", "prepare_voice", "call"],
            devices=["cpu"],
        )
    ]
