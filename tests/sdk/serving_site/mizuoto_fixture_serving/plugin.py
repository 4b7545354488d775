"""Declares the ``faulty`` and ``ranked`` engines without importing them (nor torch)."""

from mizuoto_sdk import EngineManifest, ModelEntry, Param, hookimpl

FAULTS = ("none", "exit", "hang", "hang_cancellable", "child", "slow", "invalid", "crash")


@hookimpl
def mizuoto_engines():
    return [
        EngineManifest(
            id="faulty",
            implementation="mizuoto_fixture_serving.engine:FaultyEngine",
            models=[ModelEntry("default")],
            capabilities=["synthesize", "convert", "prepare_voice", "call"],
            # cuda too, so deployment plans with cuda devices validate; it never touches a GPU
            devices=["cpu", "cuda"],
            stochastic=True,
            uses_torch=False,
            params=[
                Param("chunks", "int", 4, minimum=1, help="how many chunks a stream yields"),
                Param("chunk_samples", "int", 1600, minimum=1, help="samples per chunk"),
                Param("fault", "str", "none", choices=FAULTS, help="what goes wrong, on purpose"),
                Param("at", "int", 0, minimum=0, help="the chunk the fault comes before"),
                Param("delay", "float", 0.2, minimum=0, help="seconds before each chunk (slow)"),
                Param(
                    "marker",
                    "str",
                    "",
                    help="a folder: the stream writes child.pid (fault=child) and finally.pid "
                    "(as its finally block runs) there",
                ),
            ],
        ),
        # A torch engine whose replica may span ranks: each chunk is an all-reduce over dense_tp
        # of what every rank holds, so the audio says how many ranks took part.
        EngineManifest(
            id="ranked",
            implementation="mizuoto_fixture_serving.ranked:RankedEngine",
            models=[ModelEntry("default")],
            capabilities=["synthesize", "call"],
            devices=["cpu"],
            parallel_domains=["dense"],
            params=[
                Param("chunks", "int", 3, minimum=1, help="how many chunks a stream yields"),
                Param("hold", "float", 0.0, minimum=0, help="seconds each chunk takes"),
            ],
        ),
    ]
