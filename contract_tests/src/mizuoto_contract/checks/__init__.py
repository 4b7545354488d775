"""Every contract check, in the order they run: discovery, load, stream basics, determinism,
streams, global state, resources, inputs and errors."""

from mizuoto_contract.checks import (
    determinism,
    discovery,
    errors,
    load,
    resources,
    state,
    streaming,
    text_input,
)
from mizuoto_contract.registry import Check

ALL: tuple[Check, ...] = (
    *discovery.CHECKS,
    *load.CHECKS,
    *streaming.BASICS,
    *determinism.CHECKS,
    *streaming.CHECKS,
    *text_input.CHECKS,
    *state.CHECKS,
    *resources.CHECKS,
    *errors.CHECKS,
)

# Checks that read the run in a fresh process (mizuoto_contract.isolated), started early.
ISOLATED = frozenset(
    {
        "load.global_state",
        "determinism.fresh_process",
        "globals.untouched",
        "resources.no_processes",
        "resources.no_temp_files",
        "resources.no_threads",
        "resources.unload_releases",
    }
)

# Checks that run in a child process of their own (mizuoto_contract.childcheck), so that calls at
# once into a thread-unsafe native library that crash, or that deadlock, fail only them.
IN_CHILD = frozenset({"determinism.concurrent"})
