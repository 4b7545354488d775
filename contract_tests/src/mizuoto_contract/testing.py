"""Running the contract from an engine author's own pytest suite.

    from mizuoto_contract import parametrize_contract

    @parametrize_contract("my-engine")
    def test_contract(contract_case, mizuoto_device):
        contract_case.run(device=mizuoto_device)

Test ids are the check ids (``test_contract[stream.lazy]``), so ``-k stream.lazy`` selects one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from mizuoto_contract.registry import Check
from mizuoto_contract.runner import checks_by_id, run_check, subject_for
from mizuoto_contract.watchdog import DEFAULT_CHECK_TIMEOUT


@attrs.frozen
class ContractCase:
    """One check for one engine, run as a pytest test: failures fail, expected ones xfail."""

    engine_id: str
    check: Check
    device: str = "cpu"
    text: str | None = None

    def run(
        self, device: str | None = None, check_timeout: float | None = DEFAULT_CHECK_TIMEOUT
    ) -> None:
        """Run the check; past ``check_timeout`` seconds it fails with every thread's stack."""
        import pytest

        subject = subject_for(self.engine_id, device or self.device, text=self.text)
        result = run_check(subject, self.check, timeout=check_timeout)
        if result.status in ("failed", "xpass"):
            pytest.fail(f"[{self.check.id}] {self.check.rule}\n{result.message}", pytrace=False)
        if result.status == "xfail":
            pytest.xfail(result.message)
        if result.status == "skipped":
            pytest.skip(result.message)


def parametrize_contract(
    *engine_ids: str,
    device: str = "cpu",
    checks: Sequence[str] | None = None,
    text: str | None = None,
) -> Any:
    """A ``pytest.mark.parametrize`` over every check (or ``checks``) for each engine;
    ``text`` is what the checks speak (default: three sentences)."""
    import pytest

    if not engine_ids:
        raise ValueError("parametrize_contract: name at least one engine id")
    cases = [
        ContractCase(engine, check, device, text)
        for engine in engine_ids
        for check in checks_by_id(checks)
    ]
    ids = [c.check.id if len(engine_ids) == 1 else f"{c.engine_id}::{c.check.id}" for c in cases]
    return pytest.mark.parametrize("contract_case", cases, ids=ids)
