"""What is installed and whether it can run: the rows ``mizuoto engines --json`` prints and the
report ``mizuoto doctor`` gives (``RuntimeService.doctor``), as JSON-ready dicts.

The command line renders them as lines; the server returns them as they are. Building them never
imports torch, except to ask which build is installed once torch itself is.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING, TypedDict

from mizuoto_sdk.discovery import Discovery, EngineRecord
from mizuoto_sdk.errors import EngineError
from mizuoto_sdk.host.programs import Missing, missing_requirements

if TYPE_CHECKING:
    from mizuoto_runtime.devices.probe import TorchBuild

Extra = TypedDict("Extra", {"import": str, "requirement": str, "installed": bool})


class EngineRow(TypedDict):
    id: str
    name: str | None
    distribution: str
    version: str
    status: str
    devices: list[str]
    dtypes: list[str]
    capabilities: list[str]
    models: list[str]
    extras: list[Extra]
    missing_programs: list[Missing]
    params: list[dict[str, object]]
    parallel_domains: list[str]
    max_concurrency: int | None
    deterministic: bool | None
    api_version: str | None
    uses_torch: bool | None
    text_input: bool | None
    entry_point: str
    error: str | None


class Diagnosis(TypedDict):
    id: str
    status: str
    available: bool
    missing_extras: list[str]
    missing_programs: list[Missing]
    error: str | None
    warnings: list[str]


class DoctorReport(TypedDict):
    torch: TorchBuild
    engines: list[Diagnosis]


def engine_rows(discovery: Discovery) -> list[EngineRow]:
    """One row per engine found, failed plugins included (``mizuoto engines --json``)."""
    return [_row(record) for record in discovery.records()]


def doctor_report(discovery: Discovery, engine_id: str | None = None) -> DoctorReport:
    """The installed torch build against this machine, and whether each engine (or the one
    named) can run here; an unknown ``engine_id`` is ``engine_not_found``."""
    from mizuoto_runtime.devices.probe import torch_build

    build = torch_build()
    records = discovery.records()
    if engine_id is not None:
        records = tuple(r for r in records if r.id == engine_id)
        if not records:
            known = ", ".join(sorted({r.id for r in discovery.records()}))
            raise EngineError(
                f"no engine {engine_id!r}; known engines: {known}", code="engine_not_found"
            )
    installed = bool(build["installed"])
    return {"torch": build, "engines": [_diagnose(discovery, r, installed) for r in records]}


def _extras(record: EngineRecord) -> list[Extra]:
    extras = record.manifest.extras if record.manifest else {}
    return [
        {"import": name, "requirement": requirement, "installed": _importable(name)}
        for name, requirement in extras.items()
    ]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _row(record: EngineRecord) -> EngineRow:
    manifest = record.manifest
    return {
        "id": record.id,
        "name": manifest.name if manifest else None,
        "distribution": record.distribution,
        "version": record.version,
        "status": record.status,
        "devices": list(manifest.devices) if manifest else [],
        "dtypes": list(manifest.dtypes) if manifest else [],
        "capabilities": list(manifest.capabilities) if manifest else [],
        "models": [m.id for m in manifest.models] if manifest else [],
        "extras": _extras(record),
        "missing_programs": missing_requirements(manifest) if manifest else [],
        "params": [param.describe() for param in manifest.params] if manifest else [],
        "parallel_domains": list(manifest.parallel_domains) if manifest else [],
        "max_concurrency": manifest.max_concurrency if manifest else None,
        "deterministic": manifest.deterministic if manifest else None,
        "api_version": manifest.api_version if manifest else None,
        "uses_torch": manifest.uses_torch if manifest else None,
        "text_input": manifest.text_input if manifest else None,
        "entry_point": record.entry_point,
        "error": record.error,
    }


def _diagnose(discovery: Discovery, record: EngineRecord, torch: bool) -> Diagnosis:
    """One engine's doctor entry, after importing its implementation as ``synth`` would.

    A misspelt class, an import that fails or exits, or a class that disagrees with its manifest
    shows here with status ``unavailable`` and the reason, rather than as "available".

    Importing it must not import torch (listing and doctor stay fast and torch-free); when it
    does, that is a warning. Once torch is in this process, later engines cannot be judged on
    this point: ``mizuoto doctor ENGINE`` checks one engine in a fresh process. An engine that
    uses torch is unavailable where torch is not installed (``torch`` False).
    """
    status: str = record.status
    error = record.error
    warnings: list[str] = []
    if record.ok:
        torch_before = "torch" in sys.modules
        try:
            discovery.get_engine(record.id)
        except EngineError as unavailable:
            status, error = "unavailable", str(unavailable)
        else:
            if not torch_before and "torch" in sys.modules:
                implementation = record.manifest.implementation if record.manifest else record.id
                warnings.append(
                    f"importing {implementation} imports torch, which makes listing and doctor "
                    "slow; import torch inside load() instead"
                )
    missing = [e["requirement"] for e in _extras(record) if not e["installed"]]
    programs = missing_requirements(record.manifest) if record.manifest else []
    uses_torch = record.manifest.uses_torch if record.manifest else None
    return {
        "id": record.id,
        "status": status,
        "available": status == "ok"
        and not missing
        and not programs
        and (torch or uses_torch is False),
        "missing_extras": missing,
        "missing_programs": programs,
        "error": error,
        "warnings": warnings,
    }
