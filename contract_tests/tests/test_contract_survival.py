"""The suite survives what it catches: a check that deadlocks or crashes the process is that
check's failure, and the run goes on and writes its reports.

Engines come from tests/corpus (see test_contract_meta.py): ``broken-determinism-concurrent--
deadlock`` hangs two calls at once, ``--native_crash`` segfaults on them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mizuoto_contract import Check, Fail, zygote
from mizuoto_contract.runner import run_check
from mizuoto_contract.subject import child_result, subject_for
from mizuoto_sdk.host import Discovery

CORPUS = Path(__file__).resolve().parent / "corpus"
CHECKS = ["--check", "determinism.same_handle", "--check", "determinism.concurrent"]


@pytest.fixture
def corpus(monkeypatch: pytest.MonkeyPatch) -> Discovery:
    monkeypatch.syspath_prepend(str(CORPUS))
    monkeypatch.delenv("MIZUOTO_PLUGINS", raising=False)
    return Discovery()


def _child_environment() -> dict[str, str]:
    dropped = ("MIZUOTO_PLUGINS", "PYTEST_ADDOPTS")
    environment = {k: v for k, v in os.environ.items() if k not in dropped}
    path = [str(CORPUS), *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
    return {**environment, "PYTHONPATH": os.pathsep.join(path)}


@pytest.mark.skipif(not zygote.available(), reason="checks run in a child only on Linux")
def test_a_crash_and_a_deadlock_fail_their_check_and_the_run_writes_its_reports(tmp_path):
    engines = [
        "broken-determinism-concurrent--native_crash",
        "broken-determinism-concurrent--deadlock",
    ]
    reports = ["--json", str(tmp_path / "report.json"), "--junit", str(tmp_path / "junit.xml")]
    command = [sys.executable, "-m", "mizuoto_contract", *engines, *CHECKS, *reports]
    done = subprocess.run(
        [*command, "--check-timeout", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_child_environment(),
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed, 2 failed" in done.stdout, done.stdout
    crash, deadlock = done.stdout.split("broken-determinism-concurrent--deadlock on cpu")
    assert "observed the process died of signal 11 SIGSEGV" in crash
    assert "determinism_concurrent__native_crash.py" in crash  # the stack names the engine's line
    assert "observed still running after 3 s (a deadlock?)" in deadlock
    assert "determinism_concurrent__deadlock.py" in deadlock
    report = json.loads((tmp_path / "report.json").read_text())
    statuses = {e["engine"]: {c["id"]: c["status"] for c in e["checks"]} for e in report["engines"]}
    expected = {"determinism.same_handle": "passed", "determinism.concurrent": "failed"}
    assert statuses == dict.fromkeys(engines, expected)
    failures = [
        (case.get("classname"), case.get("name"), failure.text or "")
        for case in ET.parse(tmp_path / "junit.xml").iter("testcase")
        for failure in case.iter("failure")
    ]
    assert [(engine, name) for engine, name, _ in failures] == [
        (engine, "determinism.concurrent") for engine in engines
    ]
    assert "SIGSEGV" in failures[0][2] and "within 3 s" in failures[1][2]


def test_a_check_past_its_timeout_fails_with_every_threads_stack_in_the_suites_process(corpus):
    held = threading.Lock()
    held.acquire()

    def waits_for_a_lock_nobody_releases(subject):
        held.acquire()

    check = Check(
        "determinism.never_ends",
        "Never ends.",
        "A deadlock.",
        "Release the lock.",
        "core",
        waits_for_a_lock_nobody_releases,
    )
    subject = subject_for("corpus-good", "cpu", corpus)
    try:
        result = run_check(subject, check, timeout=0.5)
    finally:
        held.release()
    assert result.status == "failed"
    assert result.message.startswith("expected the check to end within 0.5 s\n"), result.message
    assert "in waits_for_a_lock_nobody_releases" in result.message
    assert 0.5 <= result.seconds < 5


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_child_that_dies_of_a_signal_is_a_failure_naming_it_with_its_stack():
    """What the fresh-process checks report when the engine's life there crashes."""
    crash = "import ctypes, faulthandler; faulthandler.enable(); ctypes.string_at(0)"
    child = subprocess.Popen(
        [sys.executable, "-c", crash],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with pytest.raises(Fail) as failure:
        child_result(child, "the engine's life to run in a fresh process", 60)
    assert failure.value.observed.startswith("the process died of signal 11 SIGSEGV;")
    assert "Fatal Python error: Segmentation fault" in failure.value.observed
    assert "in string_at" in failure.value.observed
