"""Declares engine ``twin``; so does mizuoto_fixture_twin_second."""

from mizuoto_sdk import Engine, EngineManifest, ModelEntry, hookimpl


class Good(Engine):
    DEVICES = ("cpu",)


@hookimpl
def mizuoto_engines():
    return [
        EngineManifest(
            id="twin",
            implementation="mizuoto_fixture_twin_first:Good",
            models=[ModelEntry("a"), ModelEntry("b"), ModelEntry("c")],
            capabilities=["synthesize", "prepare_voice", "call"],
            devices=["cpu"],
        )
    ]
