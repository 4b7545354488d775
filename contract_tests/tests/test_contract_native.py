"""A real thread-unsafe native library: the corpus engine that splits its text with the C
library's ``strtok`` (one hidden global pointer) mixes up two calls made at once, and the same
engine declaring ``max_concurrency=1`` passes every check, the host queueing its calls.

``broken-determinism-concurrent--strtok`` failing determinism.concurrent and no other check is
test_contract_meta's (every variant's); here, what declaring it changes.
"""

from __future__ import annotations

import test_contract_meta as meta

from mizuoto_contract import CheckResult, run_contract

corpus = meta.corpus  # the fixture: a discovery that sees the corpus plugins
UNSAFE = "broken-determinism-concurrent--strtok"
SERIALISED = "corpus-strtok-serialised"


def _table(results: list[CheckResult]) -> str:
    return "\n".join(f"  {r.id}: {r.status} {r.message.splitlines()[:1]}" for r in results)


def test_two_calls_at_once_take_each_others_words(corpus):
    [result] = run_contract(UNSAFE, checks=["determinism.concurrent"], discovery=corpus)
    assert result.status == "failed", _table([result])
    assert "from two calls at once" in result.message


def test_the_same_engine_declaring_max_concurrency_1_passes_every_check(corpus):
    results = run_contract(SERIALISED, discovery=corpus)
    assert [r.id for r in results] == meta.CHECK_IDS
    failed = [r for r in results if r.status != "passed" and not r.capability_skip]
    assert not failed, f"{SERIALISED} should pass every check:\n{_table(failed)}"
