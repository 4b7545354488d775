"""Entry point module: declares the engine without importing it (or torch)."""

from mizuoto_sdk import EngineManifest, ModelEntry, Param, hookimpl


@hookimpl
def mizuoto_engines() -> list[EngineManifest]:
    return [
        EngineManifest(
            id="sine",
            name="Sine tones",
            implementation="mizuoto_engine_sine.engine:SineEngine",
            models=[ModelEntry("tone", description="one tone per character, no weights")],
            capabilities=["synthesize"],
            dtypes=["float32"],
            stochastic=True,
            text_input=True,
            params=[
                Param(
                    "speed",
                    "float",
                    1.0,
                    minimum=0.25,
                    maximum=4,
                    help="tempo: 2 plays the tones twice as fast",
                )
            ],
            description="Turns text into a tone sequence; a reference for engine authors.",
        )
    ]
