"""A hook whose manifest names a device the SDK does not know."""

from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl


@hookimpl
def mizuoto_engines():
    return [
        EngineManifest(
            id="x",
            implementation="m:C",
            models=[ModelEntry("a")],
            capabilities=["synthesize"],
            devices=["tpu"],
        )
    ]
