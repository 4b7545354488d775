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


def _capabilities(subject: Subject, check: Check) -> tuple[str | None, ...]:
    """The capabilities a check goes through: every streaming one the engine declares for a
    check that streams, else the default one."""
    if "streaming" in check.needs and subject.capabilities:
        return subject.capabilities
    return (None,)


def outcome(subject: Subject, check: Check, timeout: float | None) -> tuple[str, str]:
    """Run the check's function here: ("passed" | "failed" | "skipped", message), before any
    expected failure is applied. Past ``timeout`` seconds it fails with every thread's stack."""
    try:
        with deadline(timeout):
            for capability in _capabilities(subject, check):
                try:
                    with subject.checking(capability):
                        check.function(subject)
                except Fail as failure:
                    failure.capability = capability
                    raise
                finally:
                    subject.release()  # the suite unloads what it loaded, whatever it did
    except Fail as failure:
        where = f"\nat {failure.where}" if failure.where else ""
        said = failure.capability if len(subject.capabilities) > 1 else None
        said = f" ({said})" if said is not None else ""
        return "failed", (
            f"expected {failure.expected}{said}\nobserved {failure.observed}{where}\n"
            f"fix: {check.fix}"
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
