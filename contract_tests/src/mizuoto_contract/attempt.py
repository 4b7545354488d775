"""One check's function run in this process, what it raised turned into a status and a message
(in the suite's own process, or in the child of ``childcheck``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mizuoto_contract.outcome import Fail, Skip
from mizuoto_contract.trace import short_traceback
from mizuoto_contract.watchdog import CheckTimeout, deadline

if TYPE_CHECKING:
    from mizuoto_contract.registry import Check
    from mizuoto_contract.subject import Subject


def _crash(subject: Subject, error: Exception) -> str:
    where = subject.where(error)
    lines = [f"the check crashed on the engine: {type(error).__name__}: {error}"]
    if where is not None:
        lines.append(f"at {where}")
    return "\n".join(lines) + "\n" + short_traceback(error)


def outcome(subject: Subject, check: Check, timeout: float | None) -> tuple[str, str]:
    """Run the check's function here: ("passed" | "failed" | "skipped", message), before any
    expected failure is applied. Past ``timeout`` seconds it fails with every thread's stack."""
    try:
        with deadline(timeout):
            try:
                check.function(subject)
            finally:
                subject.release()  # the suite unloads what it loaded, whatever the check did
    except Fail as failure:
        where = f"\nat {failure.where}" if failure.where else ""
        return "failed", (
            f"expected {failure.expected}\nobserved {failure.observed}{where}\nfix: {check.fix}"
        )
    except Skip as skip:
        return "skipped", str(skip)
    except CheckTimeout as late:
        return "failed", (
            f"expected the check to end within {late.seconds:g} s\n"
            f"observed still running (a deadlock?); every thread's stack:\n{late.stacks}"
        )
    except Exception as error:
        return "failed", _crash(subject, error)
    return "passed", ""
