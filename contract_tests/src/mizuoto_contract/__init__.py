"""The Mizuoto contract suite: checks with stable ids that prove an engine behaves.

Names are imported on first use, so that the pytest plugin (loaded in every pytest run of an
environment that has this package) costs nothing until a contract is asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Check": "mizuoto_contract.registry",
    "CheckResult": "mizuoto_contract.registry",
    "ContractViolation": "mizuoto_contract.registry",
    "Fail": "mizuoto_contract.registry",
    "Skip": "mizuoto_contract.registry",
    "ContractUsageError": "mizuoto_contract.runner",
    "checks_by_id": "mizuoto_contract.runner",
    "run_contract": "mizuoto_contract.runner",
    "ContractCase": "mizuoto_contract.testing",
    "parametrize_contract": "mizuoto_contract.testing",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mizuoto_contract' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
