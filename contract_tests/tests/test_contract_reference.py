"""The check reference in docs/ is the registry's own rendering, so it cannot drift."""

from __future__ import annotations

from pathlib import Path

from mizuoto_contract.checks import ALL
from mizuoto_contract.reference import render

PAGE = Path(__file__).resolve().parents[2] / "docs" / "contract-checks.md"


def test_the_reference_page_is_up_to_date():
    assert PAGE.read_text() == render(), (
        "docs/contract-checks.md is stale: python -m mizuoto_contract.reference > "
        "docs/contract-checks.md"
    )


def test_every_check_has_a_stable_dotted_id_a_rule_a_reason_and_a_fix():
    ids = [c.id for c in ALL]
    assert len(ids) == len(set(ids))
    for check in ALL:
        family, _, name = check.id.partition(".")
        assert family and name and check.id == check.id.lower()
        assert check.rule.endswith(".") and check.why and check.fix
        assert check.tier in ("core", "streaming")
