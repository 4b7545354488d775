"""What an engine needs beyond Python packages (programs, shared libraries), checked cheaply.

A program is looked up on PATH, a library as ``ctypes.util.find_library`` finds it, unless the
manifest names a probe: the engine's own function (torch-free by contract), which returns None
when the requirement is met and a reason otherwise. Listing, doctor and loading all ask here.
"""

from __future__ import annotations

import ctypes.util
import importlib
import shutil
from typing import Literal, TypedDict

from mizuoto_sdk.errors import EngineUnavailable
from mizuoto_sdk.manifest import EngineManifest, Library, Program


class Missing(TypedDict):
    """One requirement that is not met, as ``engines --json``, ``doctor --json`` show it."""

    kind: Literal["program", "library"]
    name: str
    install: str
    reason: str


def missing_requirements(manifest: EngineManifest) -> list[Missing]:
    """The manifest's programs and libraries that this machine lacks, in declaration order."""
    missing: list[Missing] = []
    requirements: list[Program | Library] = [*manifest.programs, *manifest.libraries]
    for requirement in requirements:
        reason = _check(requirement)
        if reason is not None:
            kind: Literal["program", "library"] = (
                "program" if isinstance(requirement, Program) else "library"
            )
            missing.append(
                {
                    "kind": kind,
                    "name": requirement.name,
                    "install": requirement.install,
                    "reason": reason,
                }
            )
    return missing


def unavailable(engine_id: str, missing: list[Missing]) -> EngineUnavailable:
    """The load error for an engine whose programs or libraries are missing.

    ``detail["reason"]`` is ``program_missing`` when any program is missing, else
    ``library_missing``; ``detail["install"]`` lists the commands that fix it.
    """
    programs = any(m["kind"] == "program" for m in missing)
    lines = "; ".join(
        f"{m['kind']} {m['name']}: {m['reason']} (install: {m['install']})" for m in missing
    )
    return EngineUnavailable(
        f"engine {engine_id!r} cannot run: {lines}",
        {
            "reason": "program_missing" if programs else "library_missing",
            "missing": [dict(m) for m in missing],
            "install": list(dict.fromkeys(m["install"] for m in missing)),
        },
    )


def _check(requirement: Program | Library) -> str | None:
    if requirement.probe is not None:
        return _probe(requirement.probe)
    if isinstance(requirement, Program):
        return None if shutil.which(requirement.name) else "not found on PATH"
    found = ctypes.util.find_library(requirement.name)
    return None if found else "shared library not found"


def _probe(path: str) -> str | None:
    module_name, _, function_name = path.partition(":")
    try:
        target: object = importlib.import_module(module_name)
        for part in function_name.split("."):
            target = getattr(target, part)
        if not callable(target):
            return f"probe {path} is not a function"
        result = target()
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # a probe that raises or exits says the requirement is unmet
        return f"probe {path} failed: {type(error).__name__}: {error}"
    if result is None:
        return None
    if isinstance(result, str) and result.strip():
        return result
    return f"probe {path} returned {result!r}; expected None or a reason"
