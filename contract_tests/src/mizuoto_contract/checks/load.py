"""Checks on loading: it works on the device, declares its modules and describes itself."""

from __future__ import annotations

import contextlib
import json
import sys

from mizuoto_contract.checks.resources import reachable
from mizuoto_contract.checks.state import load_leaves_state
from mizuoto_contract.outcome import Fail, Skip
from mizuoto_contract.registry import Check
from mizuoto_contract.subject import NotLoadable, Subject
from mizuoto_sdk import EngineError, LoadedEngine
from mizuoto_sdk.manifest import device_type


def loads_on_device(subject: Subject) -> None:
    if device_type(subject.device) not in subject.manifest.devices:
        raise Skip(f"{subject.engine_id} does not declare {subject.device}")
    try:
        subject.discovery.get_engine(subject.engine_id)
    except EngineError:
        raise Skip(
            "not run: the Engine class does not agree with its manifest "
            "(see discovery.class_matches_manifest)"
        ) from None
    try:
        handle = subject.load()
    except NotLoadable as failure:
        error = failure.error
        if error.code == "compute_unavailable" and error.detail.get("reason") == "device_missing":
            raise Skip(str(error)) from None
        raise Fail(f"a model loaded on {subject.device}", f"[{error.code}] {error}") from None
    handle.engine.unload()


def _hidden_modules(loaded: LoadedEngine, declared: list[object]) -> list[str]:
    """The torch modules reachable from the loaded engine (through its attributes, containers
    and helper objects) that no declared handle covers, outermost first, with their paths; none
    where torch was never imported (a torch-free engine holds none, which this observes rather
    than assumes)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    covered: set[int] = set()
    for item in declared:
        module = getattr(item, "module", item)
        covered.update(map(id, module.modules() if hasattr(module, "modules") else [module]))
    found = sorted(
        (path.removeprefix("loaded."), type(value).__name__)
        for path, value in reachable(loaded)
        if isinstance(value, torch.nn.Module) and id(value) not in covered and path != "loaded"
    )
    outer: dict[str, str] = {}
    for path, kind in found:  # a hidden module's own submodules go without saying
        if not any(path.startswith((f"{o}.", f"{o}[")) for o in outer):
            outer[path] = kind
    return [f"{path} ({kind})" for path, kind in outer.items()]


def handles_declared(subject: Subject) -> None:
    handle = subject.load()
    loaded = handle.loaded_engine
    if loaded is None:  # load() leaves the model loaded
        raise Fail("a loaded engine after load", "none")
    try:
        declared = list(loaded.handles)
    except TypeError:
        raise Fail(
            "LoadedEngine.handles to be a sequence", f"{type(loaded.handles).__name__}"
        ) from None
    hidden = _hidden_modules(loaded, declared)
    handle.engine.unload()
    if hidden and not subject.manifest.uses_torch:
        raise Fail(
            "no torch module held by an engine that declares uses_torch=False",
            f"holds {', '.join(hidden)}; declare uses_torch=True and list them in handles",
        )
    if hidden:
        raise Fail(
            "every torch module the engine holds (itself or through its helpers) listed in "
            "LoadedEngine.handles",
            f"not listed: {', '.join(hidden)}",
        )


def describe_json(subject: Subject) -> None:
    handle = subject.load()
    loaded = handle.loaded_engine
    if loaded is None:  # load() leaves the model loaded
        raise Fail("a loaded engine after load", "none")
    descriptions = [("after load", loaded.describe())]
    if subject.capability is not None:  # and after a call: what a server shows most of the time
        with contextlib.suppress(EngineError, StopIteration):  # another check's to report
            subject.close_early(handle)
        descriptions.append(("after a call", loaded.describe()))
    handle.engine.unload()
    for when, description in descriptions:
        try:
            json.dumps(dict(description))
        except (TypeError, ValueError) as error:
            raise Fail(
                f"describe() {when} to return a JSON-serialisable mapping", str(error)
            ) from None


CHECKS = (
    Check(
        "load.device",
        "The engine loads on every device it declares (the one under test).",
        "A declared device that cannot load is a broken promise to the host's placement.",
        "Load onto spec.device; drop devices you cannot support from DEVICES and the manifest.",
        "core",
        loads_on_device,
    ),
    Check(
        "load.global_state",
        "Importing and loading the engine change no process state (RNGs, flags, env, cwd, ...).",
        "Engines share the process: a seed or flag set at import or load changes everybody's "
        "results. Measured in a fresh process against a baseline taken before the engine's "
        "code is imported, so no spelling and no earlier check hides a change.",
        "Use ctx.generator_for()/ops.default for weights; pass dtypes and devices explicitly; "
        "set nothing process-wide at import.",
        "core",
        load_leaves_state,
    ),
    Check(
        "load.handles_declared",
        "Every torch module the loaded engine holds is listed in LoadedEngine.handles.",
        "The host moves, offloads and frees models through their handles; a hidden module "
        "stays on the device for ever.",
        "Put each nn.Module (or its ModelHandle) in self.handles.",
        "core",
        handles_declared,
    ),
    Check(
        "load.describe_json",
        "describe() returns a JSON-serialisable mapping, after load and after calls.",
        "The server shows it in its API and `mizuoto runtime`.",
        "Return plain str/int/float/bool/list/dict values from describe().",
        "core",
        describe_json,
    ),
)
