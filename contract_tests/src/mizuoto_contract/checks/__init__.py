"""Every contract check, in the order they run: discovery, load, determinism, streams, hygiene."""

from mizuoto_contract.checks import determinism, discovery, errors, load, state, streaming
from mizuoto_contract.registry import Check

ALL: tuple[Check, ...] = (
    *discovery.CHECKS,
    *load.CHECKS,
    *determinism.CHECKS,
    *streaming.CHECKS,
    *state.CHECKS,
    *errors.CHECKS,
)
