"""The contract suite's front ends: the mizuoto-contract CLI and the pytest helper.

Engines come from tests/corpus (real plugins, see test_contract_meta.py): in this process through
``monkeypatch.syspath_prepend``, in child processes through PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mizuoto_contract.checks import ALL
from mizuoto_contract.cli import main
from mizuoto_contract.registry import STATUSES
from mizuoto_sdk.host import Discovery

CORPUS = Path(__file__).resolve().parent / "corpus"
CHECK_IDS = [check.id for check in ALL]
TOTALS = {"ran", "passed", "failed", "xfail", "xpass", "skipped", "skipped_capability"}


def child_environment() -> dict[str, str]:
    """This environment, the corpus on PYTHONPATH, and nothing that narrows plugins or pytest."""
    dropped = ("MIZUOTO_PLUGINS", "PYTEST_ADDOPTS")
    environment = {k: v for k, v in os.environ.items() if k not in dropped}
    path = [str(CORPUS), *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
    return {**environment, "PYTHONPATH": os.pathsep.join(path)}


def run_cli(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mizuoto_contract.cli", *arguments],
        capture_output=True,
        text=True,
        timeout=600,
        env=child_environment(),
        check=False,
    )


@pytest.fixture
def corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(CORPUS))
    monkeypatch.delenv("MIZUOTO_PLUGINS", raising=False)


def assert_report_schema(report: dict) -> None:
    """Exactly the documented JSON shape, nothing more."""
    assert set(report) == {"engines", "totals"}
    assert set(report["totals"]) == TOTALS
    assert all(isinstance(v, int) for v in report["totals"].values())
    for engine in report["engines"]:
        assert set(engine) == {"engine", "device", "checks"}
        for check in engine["checks"]:
            assert set(check) == {"id", "status", "rule", "message", "capability_skip"}
            assert check["status"] in STATUSES
            assert all(isinstance(check[k], str) for k in ("id", "status", "rule", "message"))
            assert isinstance(check["capability_skip"], bool)
            assert not check["capability_skip"] or check["status"] == "skipped"


def statuses(report: dict) -> dict[str, dict[str, str]]:
    return {e["engine"]: {c["id"]: c["status"] for c in e["checks"]} for e in report["engines"]}


def test_list_names_every_check_and_leaves_torch_unimported():
    script = (
        "import sys; from mizuoto_contract.cli import main; code = main(['--list']); "
        "print('torch' in sys.modules, code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_environment(),
        check=True,
    )
    *listing, last = done.stdout.strip().splitlines()
    assert last == "False 0", done.stdout + done.stderr
    assert [line.split()[0] for line in listing] == CHECK_IDS


@pytest.fixture(scope="module")
def sine_run(tmp_path_factory: pytest.TempPathFactory):
    """One real `mizuoto-contract sine --json --junit` in a child process."""
    folder = tmp_path_factory.mktemp("sine")
    reports = ["--json", str(folder / "report.json"), "--junit", str(folder / "junit.xml")]
    done = run_cli("sine", *reports)
    return done, folder


def test_sine_exits_0_and_prints_the_totals(sine_run):
    done, _ = sine_run
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(ALL)} passed, 0 failed, 0 xfailed, 0 xpassed, 0 skipped" in done.stdout
    assert f"; {len(ALL)} ran" in done.stdout


def test_json_report_has_exactly_the_documented_schema(sine_run):
    _, folder = sine_run
    report = json.loads((folder / "report.json").read_text())
    assert_report_schema(report)
    [engine] = report["engines"]
    assert (engine["engine"], engine["device"]) == ("sine", "cpu")
    assert [c["id"] for c in engine["checks"]] == CHECK_IDS
    assert {c["status"] for c in engine["checks"]} == {"passed"}
    assert report["totals"] == {**dict.fromkeys(TOTALS, 0), "ran": len(ALL), "passed": len(ALL)}


def test_junit_report_is_xml_with_one_testcase_per_check(sine_run):
    _, folder = sine_run
    suites = ET.parse(folder / "junit.xml").getroot()
    [suite] = suites.findall("testsuite")
    assert suite.get("name") == "sine[cpu]" and suite.get("failures") == "0"
    cases = suite.findall("testcase")
    assert [case.get("name") for case in cases] == CHECK_IDS
    assert all(len(case) == 0 for case in cases)  # no failure, no skipped element


def test_a_broken_engine_exits_1_and_reports_the_rule(corpus, tmp_path, capsys):
    checks = ["--check", "load.describe_json", "--check", "load.device"]
    code = main(["broken-load-describe_json", *checks, "--junit", str(tmp_path / "junit.xml")])
    out = capsys.readouterr().out
    assert code == 1
    assert "failed   load.describe_json" in out and "passed   load.device" in out
    assert "[load.describe_json] describe() returns a JSON-serialisable mapping, after" in out
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "junit.xml").iter("testcase")}
    assert list(cases) == ["load.device", "load.describe_json"]
    assert cases["load.describe_json"].find("failure") is not None
    assert cases["load.device"].find("failure") is None


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["no-such-engine"], "no engine or distribution 'no-such-engine'"),
        (["sine", "--check", "load.no_such_check"], "unknown check id(s) ['load.no_such_check']"),
        ([], "name an engine or a distribution"),
    ],
    ids=["unknown-engine", "unknown-check", "no-target"],
)
def test_usage_mistakes_exit_2_with_a_message(corpus, capsys, arguments, message):
    assert main(arguments) == 2
    err = capsys.readouterr().err
    assert err.startswith("mizuoto-contract: error:") and message in err


def test_a_declared_expected_failure_that_fails_is_xfail_and_exits_0(corpus, tmp_path, capsys):
    report = tmp_path / "report.json"
    code = main(["expects-describe-fails", "--check", "load.describe_json", "--json", str(report)])
    assert code == 0, capsys.readouterr().out
    data = json.loads(report.read_text())
    assert_report_schema(data)
    [check] = data["engines"][0]["checks"]
    assert check["status"] == "xfail" and "describe() holds a torch.device" in check["message"]
    assert data["totals"]["xfail"] == 1


def test_a_declared_expected_failure_that_passes_is_xpass_and_exits_1(corpus, tmp_path, capsys):
    report = tmp_path / "report.json"
    code = main(["expects-describe-passes", "--check", "load.describe_json", "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 1
    assert statuses(json.loads(report.read_text())) == {
        "expects-describe-passes": {"load.describe_json": "xpass"}
    }
    assert "declared an expected failure" in out


def test_an_expected_failure_naming_no_check_is_a_usage_error(corpus, capsys):
    assert main(["expects-unknown-check", "--check", "load.describe_json"]) == 2
    err = capsys.readouterr().err
    assert "load.no_such_check" in err and "expects-unknown-check" in err


def test_a_distribution_name_runs_all_of_its_engines(corpus, tmp_path, capsys):
    report = tmp_path / "report.json"
    code = main(["mizuoto-broken", "--check", "globals.static_scan", "--json", str(report)])
    capsys.readouterr()
    engines = sorted(r.id for r in Discovery().records() if r.distribution == "mizuoto-broken")
    data = json.loads(report.read_text())
    assert_report_schema(data)
    seen = statuses(data)
    assert sorted(seen) == engines and len(engines) > 20
    assert seen["broken-globals-static_scan"] == {"globals.static_scan": "failed"}
    assert {s for checks in seen.values() for s in checks.values()} == {"passed", "failed"}
    assert code == 1


GENERATED_TESTS = """
    from mizuoto_contract import parametrize_contract


    @parametrize_contract("broken-load-describe_json", checks=["load.device", "load.describe_json"])
    def test_broken(contract_case, mizuoto_device):
        contract_case.run(device=mizuoto_device)


    @parametrize_contract("expects-describe-fails", checks=["load.describe_json"])
    def test_expected(contract_case):
        contract_case.run()


    @parametrize_contract("corpus-good", "sine", checks=["load.describe_json"])
    def test_two_engines(contract_case):
        contract_case.run()
"""


def test_parametrize_contract_in_an_engine_authors_own_pytest_run(tmp_path):
    (tmp_path / "test_generated_contract.py").write_text(textwrap.dedent(GENERATED_TESTS))
    options = ["-rA", "-p", "no:cacheprovider", "--mizuoto-device", "cpu"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *options, "test_generated_contract.py"],
        capture_output=True,
        text=True,
        timeout=600,
        env=child_environment(),
        cwd=tmp_path,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    outcomes = {
        line.split()[1]: line.split()[0]
        for line in out.splitlines()
        if line.split()[:1] in (["PASSED"], ["FAILED"], ["XFAIL"])
    }
    name = "test_generated_contract.py::"
    assert outcomes == {
        f"{name}test_broken[load.device]": "PASSED",
        f"{name}test_broken[load.describe_json]": "FAILED",
        f"{name}test_expected[load.describe_json]": "XFAIL",
        f"{name}test_two_engines[corpus-good::load.describe_json]": "PASSED",
        f"{name}test_two_engines[sine::load.describe_json]": "PASSED",
    }
    assert "[load.describe_json] describe() returns a JSON-serialisable mapping, after" in out
    assert "1 failed, 3 passed, 1 xfailed" in out


def test_python_dash_m_behaves_exactly_like_the_script():
    script = shutil.which("mizuoto-contract")
    assert script is not None, "the mizuoto-contract script is not installed"
    for arguments in (["--list"], ["--check", "no.such_check", "sine"], []):
        by_script = subprocess.run(
            [script, *arguments], capture_output=True, text=True, timeout=120, check=False
        )
        by_module = subprocess.run(
            [sys.executable, "-m", "mizuoto_contract", *arguments],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        seen = (by_module.returncode, by_module.stdout, by_module.stderr)
        assert seen == (by_script.returncode, by_script.stdout, by_script.stderr), arguments


def test_each_result_is_handed_over_as_its_check_ends(corpus):
    from mizuoto_contract import run_contract

    handed: list[tuple[str, float]] = []
    checks = ["load.device", "load.describe_json", "stream.chunks_valid"]
    results = run_contract(
        "corpus-good",
        checks=checks,
        on_result=lambda r: handed.append((r.id, time.perf_counter())),
    )
    finished = time.perf_counter()
    assert [i for i, _ in handed] == checks == [r.id for r in results]
    # The first result arrived before the last check began.
    last = results[-1]
    assert handed[0][1] <= finished - last.seconds


def test_fail_fast_stops_at_the_first_result_that_fails_the_run(corpus, capsys):
    code = main(["broken-load-describe_json", "--fail-fast"])
    out = capsys.readouterr().out
    assert code == 1
    assert "failed   load.describe_json" in out
    assert "errors.invalid_input" not in out and "stream.lazy" not in out


def test_one_cause_is_reported_once_with_the_engines_own_file_and_line(corpus, capsys):
    code = main(["broken-stream-chunks_valid--wrong_type"])
    out = capsys.readouterr().out
    assert code == 1
    failed = [line.split()[1] for line in out.splitlines() if line.startswith("  failed ")]
    assert failed == ["stream.chunks_valid"], out
    source = CORPUS / "mizuoto_broken" / "stream_chunks_valid__wrong_type.py"
    line = next(
        n for n, text in enumerate(source.read_text().splitlines(), 1) if "yield samples" in text
    )
    assert f"at {source}:{line} in synthesize" in out, out
    skipped = [line for line in out.splitlines() if line.startswith("  skipped ")]
    repeated = [line for line in skipped if "does not declare" not in line]  # not capabilities
    assert repeated and all("see stream.chunks_valid" in line for line in repeated), skipped


def test_a_skip_for_another_reason_than_a_capability_fails_the_run_in_every_tier():
    from mizuoto_contract.cli import totals
    from mizuoto_contract.registry import CheckResult

    def skipped(tier: str, capability: bool) -> CheckResult:
        return CheckResult("stream.x", "e", "cpu", "skipped", "r.", tier, "why", 0.0, capability)

    assert skipped("streaming", capability=False).bad
    assert skipped("core", capability=False).bad
    assert not skipped("streaming", capability=True).bad
    assert totals([skipped("streaming", False), skipped("core", True)])["bad"] == 1


def test_text_names_the_input_and_a_check_that_cannot_do_its_job_fails(corpus, capsys, monkeypatch):
    from mizuoto_contract import subject as subjects

    assert subjects.subject_for("corpus-good", text="Hello.").text == "Hello."
    # The stop checks bring a long text of their own: one word to speak is no excuse.
    assert main(["corpus-good", "--check", "stream.cancel", "--text", "Hello."]) == 0
    capsys.readouterr()
    # An engine that refuses every long text is stopped in its sample text: one word is one
    # chunk, produced at once, so no cancel can happen through the host, and the check says so.
    monkeypatch.setattr(subjects, "LONG_TEXTS", ())
    code = main(["corpus-good", "--check", "stream.cancel", "--text", "Hello."])
    out = capsys.readouterr().out
    assert code == 1 and "failed   stream.cancel" in out and "--text" in out
    assert main(["corpus-good", "--text", "   "]) == 2
    assert "text: expected some words" in capsys.readouterr().err


def test_the_manifests_sample_text_is_what_the_checks_speak_unless_text_is_given(corpus):
    from mizuoto_contract.subject import TEXT, subject_for

    assert subject_for("corpus-one-word").text == "Hello."
    assert subject_for("corpus-one-word", text="One. Two.").text == "One. Two."
    assert subject_for("corpus-good").text == TEXT


def test_a_run_from_another_folder_gets_a_fork_server_in_that_folder(corpus, tmp_path, monkeypatch):
    from mizuoto_contract import run_contract, zygote

    if not zygote.available():
        pytest.skip("no fork server on this platform")
    checks = ["load.global_state"]
    assert [r.status for r in run_contract("corpus-good", checks=checks)] == ["passed"]
    monkeypatch.chdir(tmp_path)
    assert [r.status for r in run_contract("corpus-good", checks=checks)] == ["passed"]


def test_the_fresh_process_runs_the_same_without_the_fork_server(corpus, monkeypatch):
    """Where forking is unavailable (not Linux), each isolated run starts an interpreter."""
    from mizuoto_contract import run_contract, zygote

    monkeypatch.setattr(zygote, "available", lambda: False)
    checks = ["load.global_state", "determinism.fresh_process", "resources.no_temp_files"]
    good = run_contract("corpus-good", checks=checks)
    assert [r.status for r in good] == ["passed"] * 3, [r.message for r in good]
    [broken] = run_contract("broken-load-global_state--seed", checks=["load.global_state"])
    assert broken.status == "failed" and "torch.rng.cpu" in broken.message


def test_a_reader_that_stops_reading_ends_the_listing_quietly():
    """`mizuoto-contract --list | head -1`: the pipe closes before the command writes."""
    child = subprocess.Popen(
        [sys.executable, "-m", "mizuoto_contract", "--list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()
    stderr = child.stderr.read()
    child.stderr.close()
    assert child.wait(timeout=120) == 1
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
