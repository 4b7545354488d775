"""The contract suite against its own corpus: each broken engine fails its check, and only it.

tests/corpus is a site directory: real plugins, installed by ``*.dist-info`` folders, whose
engines are the good engine of ``mizuoto_broken.base`` with one rule broken each. Engine
``broken-<check id with dots as dashes>`` breaks that check; a check of the registry without one
fails here. Checks that cannot run because of the broken rule (no model to load, a cause already
reported) may skip, if their message names the broken check.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from mizuoto_contract import CheckResult, run_contract
from mizuoto_contract.checks import ALL
from mizuoto_runtime.snapshot import snapshot
from mizuoto_sdk import Discovery

CORPUS = Path(__file__).resolve().parent / "corpus"
CORPUS_DISTRIBUTIONS = {
    "mizuoto-broken",
    "mizuoto-broken-api-compatible",
    "mizuoto-broken-import-cheap",
    "mizuoto-broken-register-twice",
}
CHECK_IDS = [check.id for check in ALL]


@pytest.fixture
def corpus(monkeypatch: pytest.MonkeyPatch) -> Discovery:
    """A discovery that sees the corpus plugins, through their entry points."""
    monkeypatch.syspath_prepend(str(CORPUS))
    monkeypatch.delenv("MIZUOTO_PLUGINS", raising=False)
    # determinism.fresh_process's broken engine relies on hash() being salted per process.
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    return Discovery()


def broken_engines(discovery: Discovery) -> dict[str, str]:
    """Check id -> the corpus engine that breaks it, as registered through entry points."""
    return {
        record.id.removeprefix("broken-").replace("-", "."): record.id
        for record in discovery.records()
        if record.id.startswith("broken-") and record.distribution in CORPUS_DISTRIBUTIONS
    }


def _table(results: list[CheckResult]) -> str:
    return "\n".join(f"  {r.id}: {r.status} {r.message.splitlines()[:1]}" for r in results)


def _acceptable(result: CheckResult, broken: str) -> bool:
    """Passed, or skipped because it does not apply or because of the broken rule itself."""
    if result.status == "passed":
        return True
    return result.status == "skipped" and (result.capability_skip or broken in result.message)


def _restore(check_id: str) -> None:
    """Undo what the engine breaking ``check_id`` left behind on purpose (its ``restore()``)."""
    module = sys.modules.get("mizuoto_broken." + check_id.replace(".", "_"))
    restore = getattr(module, "restore", None)
    if restore is not None:
        restore()


def test_the_corpus_breaks_every_check_of_the_registry_exactly_once(corpus):
    covered = broken_engines(corpus)
    missing = sorted(set(CHECK_IDS) - set(covered))
    unknown = sorted(set(covered) - set(CHECK_IDS))
    assert not missing, f"no corpus engine breaks {missing}: add one to tests/corpus/mizuoto_broken"
    assert not unknown, f"corpus engines break checks that do not exist: {unknown}"
    records = [r for r in corpus.records() if r.distribution in CORPUS_DISTRIBUTIONS]
    assert all(r.manifest is not None and " = mizuoto_broken." in r.entry_point for r in records)


@pytest.mark.parametrize("check_id", CHECK_IDS)
def test_the_broken_engine_fails_its_check_and_no_other(check_id, corpus):
    engine = broken_engines(corpus).get(check_id)
    assert engine is not None, f"no corpus engine breaks {check_id}"
    before, threads = snapshot(), set(threading.enumerate())
    try:
        results = run_contract(engine, discovery=corpus)
    finally:
        _restore(check_id)
    assert [r.id for r in results] == CHECK_IDS
    [target] = [r for r in results if r.id == check_id]
    assert target.status == "failed", f"{engine} was meant to fail {check_id}:\n{_table(results)}"
    assert target.message.startswith("expected "), target.message  # a Fail, not a crash
    others = [r for r in results if r.id != check_id and not _acceptable(r, check_id)]
    assert not others, f"{engine} should fail {check_id} alone:\n{_table(others)}"
    assert before.diff(snapshot()) == [], f"{engine} left process state behind"
    left = [t.name for t in threading.enumerate() if t not in threads and t.is_alive()]
    assert not left, f"{engine} left threads running: {left}"


@pytest.mark.parametrize("engine", ["sine", "corpus-good"])
def test_the_reference_engines_pass_every_check(engine, corpus):
    results = run_contract(engine, discovery=corpus)
    assert [r.id for r in results] == CHECK_IDS
    failed = [r for r in results if r.status != "passed"]
    assert not failed, f"{engine} should pass every check:\n{_table(failed)}"
