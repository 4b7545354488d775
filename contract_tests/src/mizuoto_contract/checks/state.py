"""Checks that an engine leaves the shared process as it found it: state, threads, memory."""

from __future__ import annotations

import gc
import importlib.util
import threading
import weakref
from pathlib import Path

from mizuoto_contract.registry import Check, Fail
from mizuoto_contract.subject import SEED, Subject
from mizuoto_runtime.audit import scan_tree
from mizuoto_runtime.snapshot import snapshot


def _exercise(subject: Subject) -> None:
    """Load, a full call, an early close, a cancel, and unload: everything a server does."""
    service = subject.service()
    handle = subject.load(service)
    if subject.capability is not None:
        subject.audio(handle, SEED)
        subject.close_early(handle)
        subject.cancel_midway(handle)
    service.unload()


def untouched(subject: Subject) -> None:
    before = snapshot()
    _exercise(subject)
    changes = before.diff(snapshot())
    if changes:
        raise Fail(
            "no process state changed by load, calls, close, cancel and unload",
            "; ".join(map(str, changes)),
        )


def _sources(subject: Subject) -> list[Path]:
    modules = [subject.manifest.implementation.partition(":")[0]]
    _, _, value = subject.record.entry_point.partition(" = ")
    if value.partition(":")[0].replace(".", "").isidentifier():
        modules.append(value.partition(":")[0])
    roots: list[Path] = []
    for module in modules:
        spec = importlib.util.find_spec(module.split(".")[0])
        if spec is None:
            continue
        if spec.submodule_search_locations:
            roots.extend(Path(p) for p in spec.submodule_search_locations)
        elif spec.origin:
            roots.append(Path(spec.origin))
    return sorted(set(roots))


def static_scan(subject: Subject) -> None:
    violations = [v for root in _sources(subject) for v in scan_tree(root)]
    if violations:
        raise Fail(
            "no global-state changes or attention outside accel in the engine's source",
            "; ".join(map(str, violations[:10])),
        )


def unload_releases(subject: Subject) -> None:
    import torch

    service = subject.service()
    handle = subject.load(service)
    loaded = handle.loaded
    refs = [weakref.ref(loaded)]
    refs += [weakref.ref(m) for m in vars(loaded).values() if isinstance(m, torch.nn.Module)]
    if subject.capability is not None:
        subject.audio(handle, SEED)
    del loaded
    service.unload()
    del handle, service
    gc.collect()
    alive = [ref() for ref in refs if ref() is not None]
    if alive:
        names = ", ".join(type(a).__name__ for a in alive)
        raise Fail(
            "the loaded engine and its modules garbage-collected after unload",
            f"still referenced: {names} (gc.get_referrers shows by whom)",
        )


def no_threads(subject: Subject) -> None:
    before = set(threading.enumerate())
    _exercise(subject)
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for thread in left:
        thread.join(timeout=0.5)
    left = [t.name for t in left if t.is_alive()]
    if left:
        raise Fail("no thread left running after unload", ", ".join(left))


CHECKS = (
    Check(
        "globals.untouched",
        "Load, calls, early close, cancel and unload leave the process state unchanged.",
        "Engines share a process with the host, each other and the tests.",
        "Never seed global RNGs, set torch flags, or edit env, cwd, sys.path or logging; "
        "the diff names what changed.",
        "core",
        untouched,
    ),
    Check(
        "globals.static_scan",
        "The engine's source has no global-state changes and no attention outside accel.",
        "Code paths the other checks never reach still run in production.",
        "Replace each reported call as its hint says; attention goes through accel.attention.",
        "core",
        static_scan,
    ),
    Check(
        "resources.unload_releases",
        "After unload, the loaded engine and its modules are freed.",
        "A reference kept after unload keeps the weights in device and host memory.",
        "Drop references in LoadedEngine.unload(); keep no module in globals or caches.",
        "core",
        unload_releases,
    ),
    Check(
        "resources.no_threads",
        "No thread the engine started is left running after unload.",
        "Leaked threads keep the process alive and the device busy.",
        "Join worker threads when the call or the model ends.",
        "core",
        no_threads,
    ),
)
