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


def broken(check_id: str, implementation: str | None = None, **fields: object) -> EngineManifest:
    """Engine ``broken-<check id, dots as dashes>``, by default from the module of that name."""
    implementation = implementation or f"mizuoto_broken.{check_id.replace('.', '_')}:Engine"
    return manifest("broken-" + check_id.replace(".", "-"), implementation, **fields)
