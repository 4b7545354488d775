"""The Mizuoto contract suite: checks with stable ids that prove an engine behaves.

Names are imported on first use, so that the pytest plugin (loaded in every pytest run of an
environment that has this package) costs nothing until a contract is asked for.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_EXPORTS = {
    "Check": "mizuoto_contract.registry",
    "CheckResult": "mizuoto_contract.registry",
    "Fail": "mizuoto_contract.outcome",
    "Skip": "mizuoto_contract.outcome",
    "ContractUsageError": "mizuoto_contract.outcome",
    "checks_by_id": "mizuoto_contract.runner",
    "run_contract": "mizuoto_contract.runner",
    "ContractCase": "mizuoto_contract.testing",
    "parametrize_contract": "mizuoto_contract.testing",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name == "ContractViolation":  # never raised by the suite; goes in the next release
        warnings.warn(
            "mizuoto_contract.ContractViolation is deprecated: no check raises it; a failed check "
            "is a CheckResult with status 'failed'",
            DeprecationWarning,
            stacklevel=2,
        )
        return AssertionError
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mizuoto_contract' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
