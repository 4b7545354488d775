"""Checks that can crash or hang the process run in a child: a fork of the zygote (Linux).

Calls made at once into a thread-unsafe native library can end the process with a signal, and
two threads taking two locks in opposite order never end. In a child, either is that check's
failure: the child enables ``faulthandler``, so a fatal signal leaves every thread's native and
Python stack on its stderr, and ``faulthandler.dump_traceback_later`` dumps them and ends the
child at the check's deadline. The suite's own process reads the signal or the timeout, reports
it, and goes on with the next check.

    child side: ``main([ENGINE, DEVICE, TEXT, CHECK_ID, TIMEOUT, EXAMPLES])`` prints one JSON line
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
        check.id,
        str(timeout),
        str(subject.examples),
    ]
    child = zygote.fork(
        argv, child_environment(environment, base), folder, cwd, list(path), "check"
    )
    try:
        try:
            code = child.wait(timeout + _GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            child.kill()
            code = child.wait()
        out = (folder / "stdout").read_text(errors="replace")
        err = (folder / "stderr").read_text(errors="replace")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    reported = out.strip().splitlines()[-1:]
    if code == 0 and reported:
        answer = json.loads(reported[0])
        return answer["status"], answer["message"]
    return "died", _died(check, code, err, timeout)


def main(argv: list[str]) -> None:
    """In the child: run one check, print ``{"status", "message"}`` as one JSON line."""
    from mizuoto_contract.attempt import outcome
    from mizuoto_contract.checks import ALL
    from mizuoto_contract.subject import subject_for
    from mizuoto_sdk.host import Discovery

    engine_id, device, text, check_id, timeout, examples = argv[:6]
    faulthandler.enable(all_threads=True)
    faulthandler.dump_traceback_later(float(timeout), exit=True)
    subject = subject_for(engine_id, device, Discovery(), text, int(examples))
    [check] = [c for c in ALL if c.id == check_id]
    status, message = outcome(subject, check, None)
    faulthandler.cancel_dump_traceback_later()
    answer: dict[str, Any] = {"status": status, "message": message}
    print(json.dumps(answer), flush=True)
