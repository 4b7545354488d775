"""Declares the ``witness`` engine without importing it."""

from mizuoto_sdk import EngineManifest, ModelEntry, Param, hookimpl


@hookimpl
def mizuoto_engines():
    return [
        EngineManifest(
            id="witness",
            implementation="mizuoto_fixture_witness.engine:WitnessEngine",
            models=[ModelEntry("default")],
            capabilities=["synthesize"],
            devices=["cpu"],
            uses_torch=False,
            params=[
                Param("chunks", "int", 4, minimum=1, help="how many chunks a stream yields"),
                Param("chunk_samples", "int", 1600, minimum=1, help="samples per chunk"),
                Param("log", "str", "", help="a file each step is appended to; empty: none"),
                Param("child", "bool", False, help="start a child (ctx.open_process) first"),
                Param("hold_at", "int", -1, help="wait for a cancel before this chunk; -1: never"),
                Param("unwind", "float", 0.0, minimum=0, help="seconds its cleanup takes"),
            ],
        ),
    ]
