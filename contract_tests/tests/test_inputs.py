"""The explored inputs: which seeds and texts, and how a failure is shrunk and reported."""

from __future__ import annotations

import pytest

from mizuoto_contract.cli import main
from mizuoto_contract.inputs import (
    DEFAULT_EXAMPLES,
    MAX_SHRINKS,
    SHORT_TEXTS,
    Example,
    example_seeds,
    examples,
    explore,
    first_sentence,
)
from mizuoto_contract.outcome import Fail


def test_the_default_examples_reach_every_residue_of_fourteen_and_the_seed_edges():
    seeds = example_seeds(DEFAULT_EXAMPLES, 1234)
    assert len(seeds) == len(set(seeds)) == DEFAULT_EXAMPLES
    assert seeds[0] == 1234
    assert {s % 14 for s in seeds if s < 1000} == set(range(14))
    assert {2**32, 2**63 - 1} <= set(seeds)
    assert all(0 <= s < 2**63 for s in seeds)


@pytest.mark.parametrize("count", [1, 2, 7, 33, 200])
def test_any_count_gives_that_many_distinct_seeds(count):
    seeds = example_seeds(count, 5)
    assert len(seeds) == len(set(seeds)) == count


def test_texts_take_turns_starting_with_the_sample_texts_first_sentence():
    cases = examples("One here. Two there.", 8, 1234)
    assert [c.text for c in cases[:4]] == ["One here.", *SHORT_TEXTS]
    assert cases[4].text == "One here."
    assert first_sentence("No end") == "No end"
    assert first_sentence("Dr.Who speaks. Then.") == "Dr.Who speaks."


def test_a_defect_of_one_seed_in_fourteen_is_found_and_named():
    seen: list[Example] = []

    def prop(case: Example) -> None:
        seen.append(case)
        if case.seed < 1000 and case.seed % 14 == 13:
            raise Fail("finite samples", "NaN")

    with pytest.raises(Fail) as failed:
        explore(prop, examples("Hello there.", DEFAULT_EXAMPLES, 1234))
    assert "for seed 13" in failed.value.observed
    assert failed.value.expected == "finite samples"
    assert len(seen) <= DEFAULT_EXAMPLES + MAX_SHRINKS


def test_a_failure_at_a_large_seed_is_shrunk_within_the_bound():
    calls: list[int] = []

    def prop(case: Example) -> None:
        calls.append(case.seed)
        if case.seed >= 2**20:  # a seed conversion that breaks past 20 bits
            raise Fail("audio", "an OverflowError")

    with pytest.raises(Fail) as failed:
        explore(prop, [Example("Hi.", 3), Example("Hi.", 2**63 - 1)])
    observed = failed.value.observed
    assert f"shrunk from seed {2**63 - 1}" in observed
    shrunk = int(observed.split("for seed ")[1].split(",")[0])
    assert 2**20 <= shrunk < 2**63 - 1
    assert len(calls) <= 2 + MAX_SHRINKS


def test_examples_must_be_a_whole_number_from_one(capsys):
    assert main(["sine", "--examples", "0"]) == 2
    assert "--examples" in capsys.readouterr().err
    assert main(["sine", "--examples", "many"]) == 2
