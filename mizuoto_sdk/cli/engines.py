"""``mizuoto engines`` and ``mizuoto doctor``: what is installed and whether it can run."""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shlex
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypedDict

from mizuoto_sdk import discovery
from mizuoto_sdk.discovery import SELECTION_VARIABLE, Discovery, EngineRecord
from mizuoto_sdk.errors import EngineError
from mizuoto_sdk.hooks import ENTRY_POINT_GROUP
from mizuoto_sdk.host.programs import Missing, missing_requirements

if TYPE_CHECKING:
    from mizuoto_runtime.devices.probe import TorchBuild


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    listing = commands.add_parser("engines", help="list installed engines")
    listing.add_argument(
        "--json", action="store_true", help="print every field as JSON; default: a table"
    )
    listing.set_defaults(handler=engines)
    checking = commands.add_parser("doctor", help="check torch and the engines' requirements")
    checking.add_argument(
        "engine", nargs="?", metavar="ENGINE", help="an engine id to check alone; default: all"
    )
    checking.add_argument(
        "--json", action="store_true", help="print the findings as JSON; default: lines"
    )
    checking.set_defaults(handler=doctor)


_Extra = TypedDict("_Extra", {"import": str, "requirement": str, "installed": bool})


class _Row(TypedDict):
    id: str
    name: str | None
    distribution: str
    version: str
    status: str
    devices: list[str]
    dtypes: list[str]
    capabilities: list[str]
    models: list[str]
    extras: list[_Extra]
    missing_programs: list[Missing]
    params: list[dict[str, object]]
    parallel_domains: list[str]
    api_version: str | None
    uses_torch: bool | None
    entry_point: str
    error: str | None


class _Diagnosis(TypedDict):
    id: str
    status: str
    available: bool
    missing_extras: list[str]
    missing_programs: list[Missing]
    error: str | None
    warnings: list[str]


def _extras(record: EngineRecord) -> list[_Extra]:
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


def _row(record: EngineRecord) -> _Row:
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
        "api_version": manifest.api_version if manifest else None,
        "uses_torch": manifest.uses_torch if manifest else None,
        "entry_point": record.entry_point,
        "error": record.error,
    }


def engines(args: argparse.Namespace) -> int:
    with _failures_in_table():
        rows = [_row(r) for r in Discovery().records()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(_nothing_listed())
        return 0
    table = [["ID", "DISTRIBUTION", "VERSION", "STATUS", "DEVICES", "DTYPES", "CAPABILITIES"]]
    for row in rows:
        table.append(
            [
                str(row["id"]),
                str(row["distribution"]),
                str(row["version"]),
                str(row["status"]),
                ",".join(row["devices"]),
                ",".join(row["dtypes"]),
                ",".join(row["capabilities"]),
            ]
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
    for row in rows:
        missing = [e["requirement"] for e in row["extras"] if not e["installed"]]
        if missing:
            print(f"  {row['id']}: optional extras not installed: {_pip_install(missing)}")
        for need in row["missing_programs"]:
            print(f"  {row['id']}: {_missing_line(need)}")
        if row["parallel_domains"]:
            print(f"  {row['id']}: splits across ranks: {', '.join(row['parallel_domains'])}")
        if row["error"]:
            print(f"  {row['id']} ({row['status']}): {str(row['error']).splitlines()[0]}")
    return 0


def _pip_install(requirements: list[str]) -> str:
    """The command that installs ``requirements``, quoted for a shell (``'librosa>=0.10'``)."""
    return "pip install " + " ".join(shlex.quote(r) for r in requirements)


@contextlib.contextmanager
def _failures_in_table() -> Iterator[None]:
    """Drop discovery's log line for a failed plugin while the listing shows that failure itself."""

    def shown_elsewhere(entry: logging.LogRecord) -> bool:
        return not hasattr(entry, "engine_record")

    logger = logging.getLogger(discovery.__name__)
    logger.addFilter(shown_elsewhere)
    try:
        yield
    finally:
        logger.removeFilter(shown_elsewhere)


def _nothing_listed() -> str:
    """Why no engine is listed: none installed, or ``MIZUOTO_PLUGINS`` selected none of them."""
    selection = os.environ.get(SELECTION_VARIABLE)
    none = f"no engines installed (plugins register under the {ENTRY_POINT_GROUP!r} entry point)"
    if selection is None:
        return none
    entries = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    installed = sorted({ep.dist.name for ep in entries if ep.dist is not None})
    if not installed:
        return f"{none}; {SELECTION_VARIABLE} is set to {selection!r}"
    return (
        f"no engines listed: {SELECTION_VARIABLE}={selection!r} selects none of the installed "
        f"engine distributions ({', '.join(installed)}); name some of them, or unset "
        f"{SELECTION_VARIABLE} to load all"
    )


def doctor(args: argparse.Namespace) -> int:
    """Exit 1 when an engine checked (the one named, or any without a name) cannot run here.

    A torch build that does not match the machine is reported with the command that replaces
    it, but does not fail the command by itself: engines still run on the CPU.
    """
    from mizuoto_runtime.devices.probe import torch_build
    from mizuoto_sdk.host.notorch import TORCH_INSTALL

    build = torch_build()
    discovery = Discovery()
    records = discovery.records()
    if args.engine is not None:
        records = tuple(r for r in records if r.id == args.engine)
        if not records:
            known = ", ".join(sorted({r.id for r in discovery.records()}))
            raise EngineError(
                f"no engine {args.engine!r}; known engines: {known}", code="engine_not_found"
            )
    diagnoses = [_diagnose(discovery, r, bool(build["installed"])) for r in records]
    if args.json:
        print(json.dumps({"torch": build, "engines": diagnoses}, indent=2))
    else:
        if not build["installed"]:
            print(f"torch: not installed; engines that use torch need it: {TORCH_INSTALL}")
        else:
            print(f"torch: {build['version']}, built for {build['build']}")
        accelerators = ", ".join(build["accelerators"]) or "none"
        print(f"machine accelerators: {accelerators}")
        if build["install"]:
            if build["installed"]:
                print(f"  the installed torch does not match this machine: {_mismatch(build)}")
                print(f"  replace it: {build['install']}")
            else:
                print(f"  the torch build for this machine: {build['install']}")
        for engine in diagnoses:
            problems = _problems(engine, TORCH_INSTALL)
            if not problems:
                print(f"engine {engine['id']}: available")
            elif len(problems) == 1:
                print(f"engine {engine['id']}: {problems[0]}")
            else:
                print(f"engine {engine['id']}: cannot run")
                for problem in problems:
                    print(f"  - {problem}")
            for warning in engine["warnings"]:
                print(f"  warning: {warning}")
    return 0 if all(e["available"] for e in diagnoses) else 1


def _mismatch(build: TorchBuild) -> str:
    built = build["build"] or "cpu"
    if not build["accelerators"]:
        return (
            f"it is built for {built} but this machine has no GPU, so it runs on the CPU and "
            "carries GPU libraries it cannot use"
        )
    return f"it is built for {built} but this machine has {', '.join(build['accelerators'])}"


def _missing_line(need: Missing) -> str:
    return f"needs {need['kind']} {need['name']} ({need['reason']}): {need['install']}"


def _problems(engine: _Diagnosis, torch_install: str) -> list[str]:
    """Why ``engine`` cannot run, one sentence with its fix each; empty when it can."""
    if engine["available"]:
        return []
    if engine["status"] != "ok":
        return [f"{engine['status']}: {str(engine['error']).splitlines()[0]}"]
    problems = [_missing_line(need) for need in engine["missing_programs"]]
    if engine["missing_extras"]:
        problems.append(f"lacks extras: {_pip_install(engine['missing_extras'])}")
    return problems or [f"needs torch: {torch_install}"]  # what else it lacks: torch


def _diagnose(discovery: Discovery, record: EngineRecord, torch: bool) -> _Diagnosis:
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
