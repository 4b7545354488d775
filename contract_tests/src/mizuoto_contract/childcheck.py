"""Checks that can crash or hang the process run in a child: a fork of the zygote (Linux).

Calls made at once into a thread-unsafe native library can end the process with a signal, and
two threads taking two locks in opposite order never end. In a child, either is that check's
failure: the child enables ``faulthandler``, so a fatal signal leaves every thread's native and
Python stack on its stderr, and ``faulthandler.dump_traceback_later`` dumps them and ends the
child at the check's deadline. The suite's own process reads the signal or the timeout, reports
it, and goes on with the next check.

    child side: ``main([ENGINE, DEVICE, TEXT, CHECK_IDS, TIMEOUT, EXAMPLES[, HEARD]])`` prints
    one JSON line per check as it ends
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mizuoto_contract import isolated, zygote
from mizuoto_contract.outcome import Fail
from mizuoto_contract.subject import child_environment
from mizuoto_contract.watchdog import died, faulthandler_stacks

if TYPE_CHECKING:
    from mizuoto_contract.registry import Check
    from mizuoto_contract.subject import Subject

# Beyond the check's own deadline: the child's start and its faulthandler dump.
_GRACE_SECONDS = 30.0


def available() -> bool:
    return zygote.available()


def _died(check: Check, code: int, stderr: str, timeout: float) -> str:
    """A ``Fail``-shaped message for a child that did not report."""
    if stderr.lstrip().startswith("Timeout (") or "\nTimeout (" in stderr:
        observed = f"still running after {timeout:g} s (a deadlock?); every thread's stack:"
        return (
            f"expected the check to end within {timeout:g} s\nobserved {observed}\n"
            f"{faulthandler_stacks(stderr)}\nfix: {check.fix}"
        )
    return (
        "expected the check's calls to leave the process alive\n"
        f"observed {died(code, stderr)}\nfix: {check.fix}"
    )


def run(subject: Subject, check: Check, timeout: float) -> tuple[str, str]:
    """``check`` on ``subject`` in a fork of the zygote: its (status, message)."""
    return run_many(subject, [check], timeout)[check.id]


def run_many(
    subject: Subject,
    checks: Sequence[Check],
    timeout: float,
    started: Callable[[zygote.ForkedChild], None] | None = None,
    heard: Mapping[str, object] | None = None,
) -> dict[str, tuple[str, str]]:
    """``checks`` one after the other in a fork of the zygote, sharing one subject there (what
    one check leaves in ``subject.shared`` the next reads): each one's (status, message).

    A check that ends the child (a crash, its deadline) is reported as such, and the checks
    after it run in a new fork. ``started`` is told of each fork, so that its caller can end it.
    ``heard`` (JSON) is what this process's explorations heard (``inputs.explored_to_json`` by
    ``explored:<capability>``), which the child's checks compare with.
    """
    results: dict[str, tuple[str, str]] = {}
    left = list(checks)
    while left:
        reported, code, err = _fork_and_wait(subject, left, timeout, started, heard)
        results.update(reported)
        waiting = [c for c in left if c.id not in reported]
        if not waiting:
            break
        results[waiting[0].id] = ("died", _died(waiting[0], code, err, timeout))
        left = waiting[1:]
    return results


def _fork_and_wait(
    subject: Subject,
    checks: Sequence[Check],
    timeout: float,
    started: Callable[[zygote.ForkedChild], None] | None,
    heard: Mapping[str, object] | None,
) -> tuple[dict[str, tuple[str, str]], int, str]:
    """One fork running ``checks``: what it reported, its exit code and its stderr."""
    if "isolated" in subject.shared:  # the zygote runs one child at a time: let that one end
        with contextlib.suppress(Fail):  # its readers report its failure
            isolated.report(subject)
    folder = Path(tempfile.mkdtemp(prefix="mizuoto-contract-check-"))
    base, cwd, path = subject.shared.get(
        "isolated_start", (dict(os.environ), os.getcwd(), sys.path)
    )
    environment = {
        **base,
        "MIZUOTO_PLUGINS": subject.record.distribution,
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
    }
    argv = [
        subject.engine_id,
        subject.device,
        subject.text,
        ",".join(c.id for c in checks),
        str(timeout),
        str(subject.examples),
    ]
    if heard:
        (folder / "heard.json").write_text(json.dumps(heard))
        argv.append(str(folder / "heard.json"))
    child = zygote.fork(
        argv, child_environment(environment, base), folder, cwd, list(path), "check"
    )
    if started is not None:
        started(child)
    try:
        try:
            code = child.wait(timeout * len(checks) + _GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            child.kill()
            code = child.wait()
        out = (folder / "stdout").read_text(errors="replace")
        err = (folder / "stderr").read_text(errors="replace")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    reported: dict[str, tuple[str, str]] = {}
    for line in out.splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            answer = json.loads(line)
            reported[answer["check"]] = (answer["status"], answer["message"])
    return reported, code, err


def main(argv: list[str]) -> None:
    """In the child: run the checks (ids joined by commas) one after the other on one subject,
    printing ``{"check", "status", "message"}`` as one JSON line as each ends. Each has its own
    deadline, at which ``faulthandler`` dumps every thread's stack and ends the child."""
    from mizuoto_contract.attempt import outcome
    from mizuoto_contract.checks import ALL
    from mizuoto_contract.inputs import explored_from_json
    from mizuoto_contract.subject import subject_for
    from mizuoto_sdk.host import Discovery

    engine_id, device, text, check_ids, timeout, examples = argv[:6]
    faulthandler.enable(all_threads=True)
    subject = subject_for(engine_id, device, Discovery(), text, int(examples))
    if len(argv) > 6:  # what the suite's process heard, to compare with
        heard = json.loads(Path(argv[6]).read_text())
        subject.shared.update({key: explored_from_json(rows) for key, rows in heard.items()})
    by_id = {c.id: c for c in ALL}
    for check_id in check_ids.split(","):
        faulthandler.dump_traceback_later(float(timeout), exit=True)
        status, message = outcome(subject, by_id[check_id], None)
        faulthandler.cancel_dump_traceback_later()
        answer: dict[str, Any] = {"check": check_id, "status": status, "message": message}
        print(json.dumps(answer), flush=True)
