"""A second process's share of the checks, run while the suite's own process runs the rest
(``--jobs 2``, the default where two cores are free).

Most checks call the engine one call at a time, and a small model's call is mostly Python: one
process keeps one core busy. The checks that run in a child anyway (``determinism.concurrent``,
the fresh process of ``mizuoto_contract.isolated``) and the costly ones whose work needs no model
of this process's (``BESIDE``) run in forks of the zygote, one after another, on a thread of
this process that only waits for them; ``determinism.same_handle`` runs there last, comparing
with the digests of what ``stream.chunks_valid`` heard here. Their results count when the run
reaches them: a check whose required check failed in this process is reported skipped as usual,
and once no check left here can count, the child is ended.

Two processes computing with torch at once only help with one thread each: two teams of OpenMP
threads on two cores spin against each other and make every call many times slower. The command
line gives each process ``cores // jobs`` threads (``OMP_NUM_THREADS``, set before torch loads
anywhere, so that every thread of every process of the run agrees; see ``threads_for``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from mizuoto_contract import childcheck, isolated
from mizuoto_contract.inputs import explored_to_json
from mizuoto_contract.outcome import Fail

if TYPE_CHECKING:
    from mizuoto_contract.registry import Check, CheckResult
    from mizuoto_contract.subject import Subject
    from mizuoto_contract.zygote import ForkedChild

BESIDE = frozenset(
    {"determinism.same_handle", "determinism.global_rng_independent", "stream.equivalence"}
)
"""Checks that run beside the suite's process when it has a second job: among the costliest,
and needing nothing this process computed but what ``AFTER_EXPLORING`` waits for."""
EXPLORER = "stream.chunks_valid"
AFTER_EXPLORING = frozenset({"determinism.same_handle"})
"""Checks run beside that compare with what ``EXPLORER`` heard here (its explored examples'
digests), so that each example is spoken once more there instead of twice: they run last, once
it has ended."""


def usable_cores() -> int:
    """The cores this process may run on."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_jobs() -> int:
    """Two processes where two cores are free, else one."""
    return 2 if usable_cores() >= 2 and childcheck.available() else 1


def threads_for(jobs: int) -> int:
    """torch's threads per process of a run with ``jobs`` processes."""
    return max(1, usable_cores() // max(1, jobs))


class Beside:
    """The checks run in the second process: started at once, read as the run reaches them."""

    def __init__(
        self,
        subject: Subject,
        checks: Sequence[Check],
        isolated_run: bool,
        timeout: float,
        explorer_here: bool = False,
    ) -> None:
        self.ids = frozenset(c.id for c in checks)
        self._subject = subject
        self._checks = list(checks)
        self._isolated_run = isolated_run
        self._timeout = timeout
        # What EXPLORER heard here, set once it ended (at once when it does not run here).
        self._heard: dict[str, object] = {}
        self._explored = threading.Event()
        if not explorer_here:
            self._explored.set()
        self._results: dict[str, tuple[str, str]] = {}
        self._done = threading.Event()
        self._isolated_done = threading.Event()
        self._lock = threading.Lock()
        self._child: ForkedChild | None = None
        self._stopped = False
        self._thread = threading.Thread(
            target=self._run, name="mizuoto-contract-beside", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        first = [c for c in self._checks if c.id not in AFTER_EXPLORING]
        later = [c for c in self._checks if c.id in AFTER_EXPLORING]
        try:
            if first:
                self._results.update(
                    childcheck.run_many(self._subject, first, self._timeout, self._started)
                )
            if self._isolated_run and not self._stopped:
                with contextlib.suppress(Fail):  # its readers report its failure
                    isolated.report(self._subject)
            self._isolated_done.set()
            while later and not self._stopped and not self._explored.wait(0.05):
                pass
            if later and not self._stopped:
                self._results.update(
                    childcheck.run_many(
                        self._subject, later, self._timeout, self._started, self._heard
                    )
                )
        finally:
            self._isolated_done.set()
            self._done.set()

    def _started(self, child: ForkedChild) -> None:
        with self._lock:
            self._child = child
            if self._stopped:
                child.kill()

    def outcome(self, check: Check) -> tuple[str, str]:
        """``check``'s (status, message), waiting for it if need be."""
        while check.id not in self._results and not self._done.is_set():
            self._done.wait(0.05)
        return self._results.get(check.id, ("skipped", "not run: the run was stopped"))

    def explored(self, shared: Mapping[str, object]) -> None:
        """``EXPLORER`` ended here: hand what it heard (``shared``'s ``explored:*``) to the
        checks that compare with it."""
        for key, spoken in shared.items():
            if key.startswith("explored:") and isinstance(spoken, dict):
                self._heard[key] = explored_to_json(spoken)
        self._explored.set()

    def wait_isolated(self) -> None:
        """Wait until the fresh process's run (if this side runs it) has ended."""
        if self._isolated_run:
            self._isolated_done.wait()

    def settle(
        self,
        results: Mapping[str, CheckResult],
        pending: Iterable[Check],
        isolated_ids: frozenset[str],
    ) -> None:
        """End the second process early when none of the ``pending`` checks it serves (its own,
        and those reading the fresh process) can count any more: each requires a check that
        failed here, and would be reported skipped whatever the child finds."""
        served = [
            c for c in pending if c.id in self.ids or (self._isolated_run and c.id in isolated_ids)
        ]
        if served and all(
            any(
                (cause := results.get(required)) is not None and cause.status in ("failed", "xfail")
                for required in check.requires
            )
            for check in served
        ):
            self.stop()

    def stop(self) -> None:
        """End the second process's current child and start no other; wait for its thread."""
        with self._lock:
            self._stopped = True
            child = self._child
        if child is not None:
            child.kill()
        fresh = self._subject.shared.get("isolated")
        if fresh is not None and "isolated_report" not in self._subject.shared:
            fresh[0].kill()  # its reader above then reports it ended, and the thread ends
        self._thread.join()


def run_beside(
    subject: Subject,
    selected: Sequence[Check],
    isolated_ids: frozenset[str],
    in_child: frozenset[str],
    timeout: float,
) -> Beside | None:
    """Start the second process's share of ``selected``: the checks of ``BESIDE`` and
    ``in_child``, then the fresh process's run when a check of ``isolated_ids`` reads it."""
    checks = [c for c in selected if c.id in BESIDE | in_child]
    isolated_run = any(c.id in isolated_ids for c in selected)
    if not checks and not isolated_run:
        return None
    explorer_here = any(c.id == EXPLORER for c in selected)
    return Beside(subject, checks, isolated_run, timeout, explorer_here)
