"""A hook whose manifest has an id that is not a valid engine id."""

from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl


@hookimpl
def mizuoto_engines():
    return [
        EngineManifest(
            id="Bad Id",
            implementation="m:C",
            models=[ModelEntry("a")],
            capabilities=["synthesize"],
        )
    ]
