"""Checks and their results."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import attrs

if TYPE_CHECKING:
    from mizuoto_contract.subject import Subject

Tier = Literal["core", "streaming"]
Status = Literal["passed", "failed", "xfail", "xpass", "skipped"]
STATUSES: tuple[str, ...] = ("passed", "failed", "xfail", "xpass", "skipped")


@attrs.frozen
class Check:
    """One rule of the contract. ``id`` never changes once released; ``needs`` lists the
    manifest capabilities (or ``stochastic``) without which the check does not apply;
    ``requires`` the checks whose failure this one would only repeat (it is then skipped with
    "see <id>", so that one cause is reported once)."""

    id: str
    rule: str
    why: str
    fix: str
    tier: Tier
    function: Callable[[Subject], None] = attrs.field(eq=False, repr=False)
    needs: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()


@attrs.frozen
class CheckResult:
    """How one check went for one engine on one device."""

    id: str
    engine: str
    device: str
    status: Status
    rule: str
    tier: Tier
    message: str = ""
    seconds: float = 0.0
    capability_skip: bool = False

    @property
    def bad(self) -> bool:
        """Counts against the run: a failure, an unexpected pass, or a check that could not run
        for another reason than a capability the engine lacks (any tier)."""
        if self.status in ("failed", "xpass"):
            return True
        return self.status == "skipped" and not self.capability_skip

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "status": self.status,
            "rule": self.rule,
            "message": self.message,
            "capability_skip": self.capability_skip,
        }
