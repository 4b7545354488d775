"""Engine ``future``, written for API 2.0."""

from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl


@hookimpl
def mizuoto_engines():
    return [
        EngineManifest(
            id="future",
            implementation="mizuoto_fixture_api_versions.engine:Good",
            models=[ModelEntry("a"), ModelEntry("b"), ModelEntry("c")],
            capabilities=["synthesize", "prepare_voice", "call"],
            devices=["cpu"],
            api_version="2.0",
        )
    ]
