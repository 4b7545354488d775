"""Manifests that are valid on their own; each implementation fails in its own way when used."""

from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl

IMPLEMENTATIONS = {
    "exits-on-import": "mizuoto_fixture_faults.exits_on_import:ExitingEngine",
    "unknown-dtype": "mizuoto_fixture_faults.engines:UnknownDtypeEngine",
    "number-dtypes": "mizuoto_fixture_faults.engines:NumberDtypesEngine",
    "misspelt": "mizuoto_fixture_faults.engines:WaitingEngin",
    "imports-torch": "mizuoto_fixture_faults.imports_torch:TorchAtImportEngine",
    "waits": "mizuoto_fixture_faults.engines:WaitingEngine",
    "exits-in-load": "mizuoto_fixture_faults.engines:ExitingLoadEngine",
}


@hookimpl
def mizuoto_engines():
    return [
        EngineManifest(
            id=engine_id,
            implementation=implementation,
            models=[ModelEntry("a")],
            capabilities=["synthesize"],
            devices=["cpu"],
        )
        for engine_id, implementation in IMPLEMENTATIONS.items()
    ]
