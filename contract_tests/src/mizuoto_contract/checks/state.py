"""Checks that an engine leaves the shared process as it found it, read at run time in a fresh
process (see ``mizuoto_contract.isolated``) and in its source."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mizuoto_contract.audit import scan_tree
from mizuoto_contract.isolated import PHASES, report
from mizuoto_contract.outcome import Fail, Skip
from mizuoto_contract.registry import Check
from mizuoto_contract.subject import Subject

STREAM_OUTPUT = ("stream.chunks_valid",)
_OWNERS = {"import": "discovery.class_matches_manifest", "load": "load.device"}


def phases_report(subject: Subject, key: str, phases: Sequence[str]) -> list[str]:
    """What the isolated run found under ``key`` in ``phases``, each line led by its phase.

    A run that failed before reaching them skips the check, naming the check that owns the
    failing phase; one that failed inside them is a failure, at the engine's line.
    """
    seen: dict[str, Any] = report(subject)
    found = [f"{phase}: {item}" for phase in phases for item in seen[key].get(phase, [])]
    error = seen.get("error")
    if error is None or found:
        return found
    failed = error["phase"]
    if failed in _OWNERS:  # not importable or not loadable: those checks report it
        raise Skip(f"not run: the {failed} failed in a fresh process (see {_OWNERS[failed]})")
    if failed in phases:
        raise Fail(
            f"the engine's {failed} to work in a fresh process", error["message"], error["where"]
        )
    if PHASES.index(failed) < PHASES.index(phases[0]):
        raise Skip(f"not run: the {failed} failed in a fresh process (see stream.chunks_valid)")
    return found


def load_leaves_state(subject: Subject) -> None:
    changes = phases_report(subject, "state", ("import", "load"))
    if changes:
        raise Fail(
            "no process state changed by importing and loading the engine (fresh process)",
            "; ".join(changes),
        )


def untouched(subject: Subject) -> None:
    phases = ("call", "second call", "early close", "cancel", "unload")
    changes = phases_report(subject, "state", phases)
    if changes:
        raise Fail(
            "no process state changed by calls, early close, cancel and unload (fresh process)",
            "; ".join(changes),
        )


def static_scan(subject: Subject) -> None:
    violations = [v for root in subject.sources() for v in scan_tree(root)]
    if violations:
        raise Fail(
            "no global-state changes or attention outside accel in the engine's source",
            "; ".join(map(str, violations[:10])),
        )


CHECKS = (
    Check(
        "globals.untouched",
        "Calls, early close, cancel and unload leave the process state unchanged.",
        "Engines share a process with the host, each other and the tests.",
        "Never seed global RNGs, set torch flags, or edit env, cwd, sys.path or logging; never "
        "replace a library's functions, retune the garbage collector, float modes or signals; "
        "the diff names what changed and in which phase.",
        "core",
        untouched,
        requires=STREAM_OUTPUT,
    ),
    Check(
        "globals.static_scan",
        "The engine's source has no global-state changes and no attention outside accel.",
        "Code paths the other checks never reach still run in production.",
        "Replace each reported call as its hint says; attention goes through accel.attention.",
        "core",
        static_scan,
    ),
)
