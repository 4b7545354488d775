"""Declares the ``notorch`` engine: one model, CPU only, no torch."""

from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl


@hookimpl
def mizuoto_engines():
    return [
        EngineManifest(
            id="notorch",
            implementation="mizuoto_fixture_notorch.engine:NoTorchEngine",
            models=[ModelEntry("default")],
            capabilities=["synthesize"],
            devices=["cpu"],
            stochastic=True,
            uses_torch=False,
        )
    ]
