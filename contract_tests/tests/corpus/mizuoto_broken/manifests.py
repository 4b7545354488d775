"""Manifests for the corpus's plugin modules: every engine synthesizes, on cpu, stochastically."""

from __future__ import annotations

from mizuoto_sdk import EngineManifest, ModelEntry

BASE = "mizuoto_broken.base:BaseEngine"


def manifest(engine_id: str, implementation: str, **fields: object) -> EngineManifest:
    fields.setdefault("capabilities", ["synthesize"])
    return EngineManifest(
        id=engine_id,
        implementation=implementation,
        models=[ModelEntry("notes", description="one note per character, no weights")],
        devices=["cpu"],
        stochastic=True,
        **fields,  # type: ignore[arg-type]
    )


def broken(
    check_id: str,
    implementation: str | None = None,
    *,
    variant: str | None = None,
    **fields: object,
) -> EngineManifest:
    """Engine ``broken-<check id, dots as dashes>[--<variant>]``, by default from the module
    ``<check id, dots as underscores>[__<variant>]``."""
    module = check_id.replace(".", "_") + (f"__{variant}" if variant else "")
    implementation = implementation or f"mizuoto_broken.{module}:Engine"
    engine_id = "broken-" + check_id.replace(".", "-") + (f"--{variant}" if variant else "")
    return manifest(engine_id, implementation, **fields)
