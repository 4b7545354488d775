"""What a check raises to say how it went, and the error for a run that is itself wrong."""

from __future__ import annotations


class Fail(Exception):
    """Raised by a check: the engine broke the rule. Say what was expected and what was seen,
    and (``where``) the engine's own ``file:line`` when its code is at fault."""

    def __init__(self, expected: str, observed: str, where: str | None = None) -> None:
        super().__init__(f"expected {expected}; observed {observed}")
        self.expected = expected
        self.observed = observed
        self.where = where
        self.capability: str | None = None
        """The capability being checked when it was raised (set by the suite)."""


class Skip(Exception):
    """Raised by a check that cannot run here (no such device, nothing to compare)."""


class ContractUsageError(ValueError):
    """The run itself is wrong: an unknown engine, check id or expected-failure id."""
