"""Running checks against an engine, with its declared expected failures applied."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from mizuoto_contract import childcheck, isolated
from mizuoto_contract.attempt import outcome
from mizuoto_contract.beside import EXPLORER, Beside, run_beside
from mizuoto_contract.checks import ALL, IN_CHILD, ISOLATED
from mizuoto_contract.inputs import DEFAULT_EXAMPLES
from mizuoto_contract.outcome import ContractUsageError
from mizuoto_contract.registry import Check, CheckResult, Status
from mizuoto_contract.subject import Subject, subject_for
from mizuoto_contract.watchdog import DEFAULT_CHECK_TIMEOUT
from mizuoto_sdk.discovery import normalize_name
from mizuoto_sdk.host import Discovery


def checks_by_id(ids: Iterable[str] | None = None) -> tuple[Check, ...]:
    """The checks to run, in registry order; an unknown id names the known ones."""
    if ids is None:
        return ALL
    wanted = list(ids)
    known = {c.id for c in ALL}
    unknown = [i for i in wanted if i not in known]
    if unknown:
        raise ContractUsageError(f"unknown check id(s) {unknown}; see `mizuoto-contract --list`")
    return tuple(c for c in ALL if c.id in wanted)


def engines_for(target: str, discovery: Discovery) -> list[str]:
    """Engine ids for an engine id or a distribution name."""
    records = [r for r in discovery.records() if r.manifest is not None]
    if any(r.id == target for r in records):
        return [target]
    by_distribution = sorted(
        {r.id for r in records if normalize_name(r.distribution) == normalize_name(target)}
    )
    if by_distribution:
        return by_distribution
    known = sorted({r.id for r in records})
    raise ContractUsageError(f"no engine or distribution {target!r}; engines: {', '.join(known)}")


_TRAITS = ("streaming", "stochastic", "deterministic", "text_input")
"""Needs that are traits of the manifest, not capabilities."""


def _needs_met(subject: Subject, check: Check) -> str | None:
    for need in check.needs:
        if need == "streaming" and subject.capability is None:
            return "the engine has no streaming capability (synthesize, convert or edit)"
        if need == "stochastic" and not subject.manifest.stochastic:
            return "the engine does not declare itself stochastic"
        if need == "deterministic" and not subject.manifest.deterministic:
            return "the engine declares deterministic=False: its audio is not compared"
        if need == "text_input" and not subject.manifest.text_input:
            return "the engine does not declare text_input (it reads no text streamed in)"
        if need not in _TRAITS and need not in subject.manifest.capabilities:
            return f"the engine does not declare {need}"
    return None


def run_check(
    subject: Subject,
    check: Check,
    earlier: Mapping[str, CheckResult] | None = None,
    timeout: float | None = DEFAULT_CHECK_TIMEOUT,
    beside: Beside | None = None,
) -> CheckResult:
    """Run one check; expected failures from the manifest turn into xfail / xpass.

    ``earlier`` holds the results so far: a check whose ``requires`` failed is skipped, naming
    the failed check, so that one cause is reported once. A check that runs past ``timeout``
    seconds fails with every thread's stack; the checks in ``IN_CHILD`` run in a child process
    (Linux), so that a crash or a deadlock there is their failure and not the run's end. A
    check ``beside`` runs is read from it (``mizuoto_contract.beside``).
    """

    def result(status: Status, message: str = "", capability: bool = False) -> CheckResult:
        return CheckResult(
            check.id,
            subject.engine_id,
            subject.device,
            status,
            check.rule,
            check.tier,
            message,
            time.perf_counter() - started,
            capability,
        )

    started = time.perf_counter()
    if subject.record.status != "ok" and not check.id.startswith("discovery."):
        return result(
            "skipped",
            f"not run: the engine is {subject.record.status} (see discovery.api_compatible)",
        )
    missing = _needs_met(subject, check)
    if missing is not None:
        return result("skipped", missing, capability=True)
    for required in check.requires:
        cause = (earlier or {}).get(required)
        if cause is not None and cause.status in ("failed", "xfail"):
            if cause.status == "xfail":
                return result("xfail", f"not run: see {required} (an expected failure)")
            return result("skipped", f"not run: see {required}, whose failure this would repeat")
    reason = subject.manifest.expected_failures.get(check.id)
    if beside is not None and check.id in beside.ids:
        status, message = beside.outcome(check)
    elif check.id in IN_CHILD and childcheck.available():
        status, message = childcheck.run(subject, check, timeout or DEFAULT_CHECK_TIMEOUT)
    else:
        status, message = outcome(subject, check, timeout)
    if status == "skipped":
        return result("skipped", message)
    if status == "passed":
        if reason is not None:
            return result("xpass", f"declared an expected failure ({reason}) but passed")
        return result("passed")
    if reason is not None:
        return result("xfail", f"expected failure: {reason}")
    return result("failed", message)


def run_contract(
    engine_id: str,
    device: str = "cpu",
    checks: Sequence[str] | None = None,
    discovery: Discovery | None = None,
    *,
    text: str | None = None,
    examples: int = DEFAULT_EXAMPLES,
    on_result: Callable[[CheckResult], None] | None = None,
    fail_fast: bool = False,
    check_timeout: float | None = DEFAULT_CHECK_TIMEOUT,
    jobs: int = 1,
) -> list[CheckResult]:
    """Run the contract (or the named checks) against one engine on one device.

    ``on_result`` is called with each result as its check ends; ``fail_fast`` stops after the
    first result that counts against the run. ``text`` is what the checks speak, ``examples`` how
    many seeds each explored property tries (``mizuoto_contract.inputs``). A check that
    runs past ``check_timeout`` seconds fails with every thread's stack, and the run goes on.
    ``jobs=2`` runs a share of the checks in a second process meanwhile (Linux;
    ``mizuoto_contract.beside``): give each process ``beside.threads_for(jobs)`` torch threads.
    """
    import numpy  # noqa: F401 - imported before snapshots, so that importing is not a change

    subject = subject_for(engine_id, device, discovery, text, examples)
    known = {c.id for c in ALL}
    stale = sorted(set(subject.manifest.expected_failures) - known)
    if stale:
        raise ContractUsageError(
            f"engine {engine_id!r} declares expected failures for unknown checks {stale}; "
            "remove them or fix the ids (see `mizuoto-contract --list`)"
        )
    selected = checks_by_id(checks)
    if subject.record.status == "ok" and any(c.id in ISOLATED | IN_CHILD for c in selected):
        isolated.prepare(subject)  # the fork server imports torch while this process does
    if subject.manifest.uses_torch:  # an engine that does not is checked without torch
        import torch  # noqa: F401
    second: Beside | None = None
    if jobs > 1 and subject.record.status == "ok" and childcheck.available():
        second = run_beside(
            subject, selected, ISOLATED, IN_CHILD, check_timeout or DEFAULT_CHECK_TIMEOUT
        )
    aside = second.ids if second is not None else frozenset()
    # The checks that read the fresh process run last (see isolated.prepare). Those run beside
    # are read when a check here requires them, else before those; the checks here that require
    # one run after those that do not, so that this process has work while the other computes.
    here = [c for c in selected if c.id not in ISOLATED | aside]
    order = [
        *(c for c in here if not aside.intersection(c.requires)),
        *(c for c in here if aside.intersection(c.requires)),
        *(c for c in selected if c.id in aside),
        *(c for c in selected if c.id in ISOLATED),
    ]
    results: dict[str, CheckResult] = {}

    def report(check: Check) -> bool:
        """Run or read ``check``; False when the run stops (fail_fast)."""
        for required in check.requires:  # a requirement run beside is read first
            pending = required in aside and required not in results
            if pending and not report(next(c for c in selected if c.id == required)):
                return False
        if check.id in results:
            return True
        if second is not None and check.id in ISOLATED:
            second.wait_isolated()
        results[check.id] = run_check(subject, check, results, check_timeout, second)
        if on_result is not None:
            on_result(results[check.id])
        if second is not None:
            if check.id == EXPLORER:
                second.explored(subject.shared)
            second.settle(results, [c for c in order if c.id not in results], ISOLATED)
        return not (fail_fast and results[check.id].bad)

    try:
        for check in order:
            if not report(check):
                break
    finally:
        if second is not None:
            second.stop()
        isolated.stop(subject)
    return [results[c.id] for c in selected if c.id in results]
