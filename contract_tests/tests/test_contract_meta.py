"""The contract suite against its own corpus: each broken engine fails its check, and only it.

tests/corpus is a site directory: real plugins, installed by ``*.dist-info`` folders, whose
engines are the good engine of ``mizuoto_broken.base`` with one rule broken each. Engine
``broken-<check id with dots as dashes>`` breaks that check; a check of the registry without one
fails here. Variants (``broken-<check>--<variant>``, module ``<check>__<variant>``) break the same
check another way: a disguised spelling, another kind of bad chunk; a variant whose breakage
necessarily breaks more than one rule lists them all in its module's ``BREAKS``. Checks that
cannot run because of the broken rule (no model to load, a cause already reported) may skip, if
their message names the broken check.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mizuoto_contract import CheckResult, run_contract
from mizuoto_contract.checks import ALL
from mizuoto_contract.snapshot import snapshot
from mizuoto_contract.watchdog import DEFAULT_CHECK_TIMEOUT
from mizuoto_sdk.host import Discovery

CORPUS = Path(__file__).resolve().parent / "corpus"
CORPUS_DISTRIBUTIONS = {
    "mizuoto-broken",
    "mizuoto-broken-api-compatible",
    "mizuoto-broken-import-cheap",
    "mizuoto-broken-register-twice",
}
CHECK_IDS = [check.id for check in ALL]
_MODULES = {check.replace(".", "_"): check for check in CHECK_IDS}
# In the package, or beside it when the breakage would show in the static scan of every corpus
# engine (the scan reads an implementation's whole top-level package).
_VARIANT_FILES = [
    *(CORPUS / "mizuoto_broken").glob("[a-z]*__*.py"),
    *CORPUS.glob("mizuoto_broken_*__*.py"),
]
VARIANTS = sorted(
    "broken-" + _MODULES[module].replace(".", "-") + "--" + variant
    for module, _, variant in (
        p.stem.removeprefix("mizuoto_broken_").partition("__") for p in _VARIANT_FILES
    )
)


@pytest.fixture
def corpus(monkeypatch: pytest.MonkeyPatch) -> Discovery:
    """A discovery that sees the corpus plugins, through their entry points."""
    monkeypatch.syspath_prepend(str(CORPUS))
    monkeypatch.delenv("MIZUOTO_PLUGINS", raising=False)
    return Discovery()


def broken_engines(discovery: Discovery) -> dict[str, str]:
    """Engine id -> the check it breaks, as registered through entry points."""
    return {
        record.id: record.id.removeprefix("broken-").partition("--")[0].replace("-", ".")
        for record in discovery.records()
        if record.id.startswith("broken-") and record.distribution in CORPUS_DISTRIBUTIONS
    }


def _module(engine: str, discovery: Discovery) -> str:
    """The module of the engine's implementation (incompatible engines included)."""
    [manifest] = [r.manifest for r in discovery.records() if r.id == engine and r.manifest]
    return manifest.implementation.partition(":")[0]


def _table(results: list[CheckResult]) -> str:
    return "\n".join(f"  {r.id}: {r.status} {r.message.splitlines()[:1]}" for r in results)


def _acceptable(result: CheckResult, broken: tuple[str, ...]) -> bool:
    """Passed, or skipped because it does not apply or because of the broken rule itself."""
    if result.status == "passed":
        return True
    return result.status == "skipped" and (
        result.capability_skip or any(b in result.message for b in broken)
    )


def _restore(engine: str, discovery: Discovery) -> None:
    """Undo what the broken engine left behind on purpose (its module's ``restore()``)."""
    module = sys.modules.get(_module(engine, discovery))
    restore = getattr(module, "restore", None)
    if restore is not None:
        restore()


def test_the_corpus_breaks_every_check_of_the_registry(corpus):
    covered = broken_engines(corpus)
    missing = sorted(set(CHECK_IDS) - set(covered.values()))
    unknown = sorted(set(covered.values()) - set(CHECK_IDS))
    assert not missing, f"no corpus engine breaks {missing}: add one to tests/corpus/mizuoto_broken"
    assert not unknown, f"corpus engines break checks that do not exist: {unknown}"
    primary = {f"broken-{c.replace('.', '-')}" for c in CHECK_IDS}
    assert sorted(set(covered) - primary) == VARIANTS
    records = [r for r in corpus.records() if r.distribution in CORPUS_DISTRIBUTIONS]
    assert all(r.manifest is not None and " = mizuoto_broken." in r.entry_point for r in records)


# Engines whose check runs until its timeout: a short one keeps the test short.
_CHECK_TIMEOUTS = {"broken-determinism-concurrent--deadlock": 5.0}


def _assert_fails_only(engine: str, corpus: Discovery) -> None:
    check_id = broken_engines(corpus)[engine]
    before, threads = snapshot(), set(threading.enumerate())
    timeout = _CHECK_TIMEOUTS.get(engine, DEFAULT_CHECK_TIMEOUT)
    try:
        results = run_contract(engine, discovery=corpus, check_timeout=timeout)
    finally:
        _restore(engine, corpus)
    breaks = getattr(sys.modules.get(_module(engine, corpus)), "BREAKS", (check_id,))
    assert [r.id for r in results] == CHECK_IDS
    for broken in breaks:
        [target] = [r for r in results if r.id == broken]
        assert target.status == "failed", f"{engine} was meant to fail {broken}:\n{_table(results)}"
        assert target.message.startswith("expected "), target.message  # a Fail, not a crash
    others = [r for r in results if r.id not in breaks and not _acceptable(r, breaks)]
    assert not others, f"{engine} should fail {', '.join(breaks)} alone:\n{_table(others)}"
    assert before.diff(snapshot()) == [], f"{engine} left process state behind"
    left = [t.name for t in threading.enumerate() if t not in threads and t.is_alive()]
    assert not left, f"{engine} left threads running: {left}"


@pytest.mark.parametrize("check_id", CHECK_IDS)
def test_the_broken_engine_fails_its_check_and_no_other(check_id, corpus):
    _assert_fails_only(f"broken-{check_id.replace('.', '-')}", corpus)


@pytest.mark.parametrize("engine", VARIANTS)
def test_each_variant_fails_its_check_and_no_other(engine, corpus):
    importlib.invalidate_caches()
    _assert_fails_only(engine, corpus)


@pytest.mark.parametrize("engine", ["sine", "corpus-good", "corpus-strict"])
def test_the_reference_engines_pass_every_check(engine, corpus):
    results = run_contract(engine, discovery=corpus)
    assert [r.id for r in results] == CHECK_IDS
    failed = [r for r in results if r.status != "passed"]
    assert not failed, f"{engine} should pass every check:\n{_table(failed)}"


def test_the_suite_unloads_every_model_it_loads(corpus):
    results = run_contract("corpus-counted", discovery=corpus)
    assert all(r.status == "passed" for r in results), _table(results)
    counted = importlib.import_module("mizuoto_broken.counted")
    assert counted.LOADS[0] > 10  # most checks load (the fresh process's loads are not here)
    assert counted.UNLOADS[0] == counted.LOADS[0]


def test_an_engine_that_declares_itself_not_deterministic_passes_every_other_check(corpus):
    results = run_contract("corpus-nondeterministic", discovery=corpus)
    assert [r.id for r in results] == CHECK_IDS
    bad = [r for r in results if r.status != "passed" and not r.capability_skip]
    assert not bad, _table(bad)
    compared = {r.id for r in results if r.capability_skip}
    assert "determinism.same_handle" in compared and "determinism.concurrent" not in compared


def test_hash_dependent_output_fails_fresh_process_under_a_fixed_pythonhashseed():
    """tox and many CI runners export PYTHONHASHSEED; the fresh process must not inherit it."""
    path = [str(CORPUS), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    environment = {
        **{k: v for k, v in os.environ.items() if k != "MIZUOTO_PLUGINS"},
        "PYTHONHASHSEED": "0",
        "PYTHONPATH": os.pathsep.join(path),
    }
    check = ["--check", "determinism.fresh_process"]
    done = subprocess.run(
        [sys.executable, "-m", "mizuoto_contract", "broken-determinism-fresh_process", *check],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "failed   determinism.fresh_process" in done.stdout
