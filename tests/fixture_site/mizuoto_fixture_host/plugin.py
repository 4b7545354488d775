"""Declares the ``hosted`` engine (models a, b, c; CPU only; params as given) and ``declared``
(the same engine, with its params declared, and ``convert``)."""

from mizuoto_sdk import EngineManifest, ModelEntry, Param, hookimpl

DECLARED_PARAMS = [
    Param("mode", "str", "tones", help="which behaviour (see the package docstring)"),
    Param("chunks", "int", 3, minimum=1, maximum=1000, help="how many chunks"),
    Param("level", "float", 0.5, minimum=0, maximum=1, exclusive_minimum=True, help="loudness"),
    Param("loud", "bool", False, help="a switch"),
    Param("style", "str", "plain", choices=["plain", "bright"], help="a choice"),
    Param("voice", "path", None, help="an optional path"),
]


@hookimpl
def mizuoto_engines():
    return [
        EngineManifest(
            id="hosted",
            implementation="mizuoto_fixture_host.engine:HostEngine",
            models=[ModelEntry("a"), ModelEntry("b"), ModelEntry("c")],
            capabilities=["synthesize", "prepare_voice", "call"],
            devices=["cpu"],
        ),
        EngineManifest(
            id="declared",
            implementation="mizuoto_fixture_host.engine:HostEngine",
            models=[ModelEntry("a")],
            capabilities=["synthesize", "convert", "prepare_voice", "call"],
            devices=["cpu"],
            params=DECLARED_PARAMS,
        ),
    ]
