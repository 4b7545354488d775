"""Two processes at once (``--jobs 2``): the checks run beside the suite's process and the fresh
process report what one process alone reports, a child that dies takes no later check with it,
and a failure that every check beside would repeat ends the second process early.

Engines come from tests/corpus (see test_contract_meta.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import test_contract_meta as meta
import test_contract_survival as survival

from mizuoto_contract import beside, childcheck, cli
from mizuoto_contract.beside import BESIDE
from mizuoto_contract.checks import ALL, IN_CHILD, ISOLATED
from mizuoto_contract.inputs import Example, explored_from_json, explored_to_json, same_take
from mizuoto_contract.subject import subject_for

corpus = meta.corpus  # the fixture: a discovery that sees the corpus plugins
pytestmark = pytest.mark.skipif(
    not childcheck.available(), reason="a second process is a fork of the zygote (Linux)"
)

# Each breaks a check that runs beside, one read from the fresh process, or the check that
# every other requires (stream.chunks_valid: what runs beside is then ended, not waited for).
ENGINES = [
    "broken-determinism-same_handle",
    "broken-determinism-same_handle--seed",
    "broken-determinism-concurrent--strtok",
    "broken-load-global_state",
    "broken-stream-chunks_valid",
]


def test_checks_run_beside_report_what_one_process_reports(tmp_path):
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "mizuoto_contract", *ENGINES, "--jobs", "2"]
    done = subprocess.run(
        [*command, "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in survival._child_environment().items() if k != "OMP_NUM_THREADS"},
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    runs = {e["engine"]: e["checks"] for e in json.loads(report.read_text())["engines"]}
    assert sorted(runs) == sorted(ENGINES), done.stdout
    for engine, checks in runs.items():
        assert [c["id"] for c in checks] == meta.CHECK_IDS, engine
        broken = engine.removeprefix("broken-").partition("--")[0].replace("-", ".")
        statuses = {c["id"]: c for c in checks}
        assert statuses[broken]["status"] == "failed", f"{engine}: {statuses[broken]}"
        others = [
            f"{c['id']}: {c['status']} {c['message'][:120]!r}"
            for c in checks
            if c["id"] != broken
            and c["status"] != "passed"
            and not (c["status"] == "skipped" and broken in c["message"])
            and not c["message"].startswith("the engine does not declare")
        ]
        assert not others, f"{engine} should fail {broken} alone:\n" + "\n".join(others)
    # The check every other requires failed: what runs beside was not run to its end.
    gate = {c["id"]: c for c in runs["broken-stream-chunks_valid"]}
    for check_id in BESIDE | IN_CHILD | ISOLATED:
        assert gate[check_id]["status"] in ("skipped", "passed"), gate[check_id]


def test_what_the_explorer_heard_crosses_to_the_other_process_as_digests():
    spoken = {Example("Seven bridges.", 3): b"\x01\x02", Example("x", 2**63 - 1): None}
    heard = explored_from_json(json.loads(json.dumps(explored_to_json(spoken))))
    assert list(heard) == list(spoken)
    assert same_take(b"\x01\x02", heard[Example("Seven bridges.", 3)])  # type: ignore[arg-type]
    assert not same_take(b"\x01\x03", heard[Example("Seven bridges.", 3)])  # type: ignore[arg-type]
    assert heard[Example("x", 2**63 - 1)] is None


def test_a_check_that_ends_its_child_takes_no_later_check_with_it(corpus):
    subject = subject_for("broken-determinism-concurrent--native_crash", "cpu", corpus, None, 4)
    by_id = {c.id: c for c in ALL}
    started = []
    checks = [by_id["determinism.concurrent"], by_id["determinism.same_handle"]]
    results = childcheck.run_many(subject, checks, 60.0, started.append)
    assert results["determinism.concurrent"][0] == "died"
    assert "SIGSEGV" in results["determinism.concurrent"][1]
    assert results["determinism.same_handle"] == ("passed", "")
    assert len(started) == 2  # the check after the crash ran in a new fork


def test_each_process_gets_its_share_of_the_cores_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(beside, "usable_cores", lambda: 8)
    cli._threads(2)
    assert os.environ["OMP_NUM_THREADS"] == "4"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    cli._threads(2)
    assert os.environ["OMP_NUM_THREADS"] == "3"
    monkeypatch.delenv("OMP_NUM_THREADS")
    cli._threads(1)  # one process keeps torch's own count
    assert "OMP_NUM_THREADS" not in os.environ


def test_jobs_other_than_one_or_two_are_a_usage_error(capsys):
    assert cli.main(["sine", "--jobs", "3"]) == 2
    assert "--jobs: expected 1 or 2, got '3'" in capsys.readouterr().err
