"""Engine ``minor``, written for API 1.9."""

from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl


@hookimpl
def mizuoto_engines():
    return [
        EngineManifest(
            id="minor",
            implementation="mizuoto_fixture_api_versions.engine:Good",
            models=[ModelEntry("a"), ModelEntry("b"), ModelEntry("c")],
            capabilities=["synthesize", "prepare_voice", "call"],
            devices=["cpu"],
            api_version="1.9",
        )
    ]
