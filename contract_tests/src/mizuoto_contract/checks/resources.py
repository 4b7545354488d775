"""Checks that an engine gives back what it takes: memory, threads, processes, files, sockets."""

from __future__ import annotations

import functools
import gc
import sys
import types
import weakref
from collections import deque
from collections.abc import Iterator
from itertools import islice

from mizuoto_contract.checks.state import STREAM_OUTPUT, phases_report
from mizuoto_contract.isolated import report
from mizuoto_contract.outcome import Fail
from mizuoto_contract.registry import Check
from mizuoto_contract.subject import SEED, Subject, differ

# Left after these phases, a process, file or socket is a leak: later calls compare with what the
# first call left (a worker or cache made once is allowed), unload with the start.
_LEAK_PHASES = ("second call", "early close", "cancel", "unload")
_MAX_DEPTH = 8
_MAX_ITEMS = 4_096  # items looked at in one container
_MAX_LISTED = 8  # leaks named in a failure; the rest are counted
# Packages whose objects the walks do not look inside: the host's, torch's, numpy's, Python's.
_NOT_OWNED = ("builtins", "torch", "numpy", "mizuoto_sdk", "mizuoto_runtime")
_ATOMS = (str, bytes, int, float, complex, bool, type(None))


def reachable(loaded: object) -> Iterator[tuple[str, object]]:
    """The loaded engine, and every nn.Module and tensor reachable from it, with their paths.

    Follows attributes, containers, ModelHandles, modules' own attributes and whatever a helper
    holds: an instance of the engine's (or a library's) class, callable or not, a bound method's
    object, a partial's arguments, a closure's cells. Stops at classes, modules and the SDK's,
    runtime's and libraries' own objects. Where torch was never imported there are no modules
    or tensors: the loaded engine is all there is.
    """
    yield "loaded", loaded
    torch = sys.modules.get("torch")
    if torch is None:
        return
    from mizuoto_runtime.memory.handle import ModelHandle

    seen: set[int] = set()
    stack: list[tuple[str, object, int]] = [("loaded", loaded, 0)]
    while stack:
        path, value, depth = stack.pop()
        if id(value) in seen or depth > _MAX_DEPTH or isinstance(value, _ATOMS):
            continue
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            yield path, value
            continue
        if isinstance(value, torch.nn.Module):
            yield path, value
            inside = [
                *value.named_children(),
                *value.named_parameters(recurse=False),
                *value.named_buffers(recurse=False),
                *((k, v) for k, v in vars(value).items() if not k.startswith("_")),
            ]
            stack.extend((f"{path}.{name}", item, depth + 1) for name, item in inside)
        elif isinstance(value, ModelHandle):
            stack.append((f"{path}.module", value.module, depth + 1))
        elif isinstance(value, (list, tuple, set, frozenset, deque, dict)):
            pairs = value.items() if isinstance(value, dict) else enumerate(value)
            # the first items only: a lexicon of a hundred thousand entries holds no model
            items = [(k, v) for k, v in islice(pairs, _MAX_ITEMS) if not isinstance(v, _ATOMS)]
            stack.extend((f"{path}[{k!r}]", item, depth + 1) for k, item in items)
        else:
            stack.extend((f"{path}{step}", item, depth + 1) for step, item in _held_by(value))


def _held_by(value: object) -> list[tuple[str, object]]:
    """What a helper holds, each with the step that reaches it (``.name``)."""
    if isinstance(value, types.MethodType):
        return [(".__self__", value.__self__)]
    if isinstance(value, functools.partial):
        arguments = [*enumerate(value.args), *value.keywords.items()]
        return [(".func", value.func), *((f".args[{k!r}]", a) for k, a in arguments)]
    if isinstance(value, types.FunctionType):
        cells = zip(value.__code__.co_freevars, value.__closure__ or (), strict=False)
        return [(f".<{name}>", _contents(cell)) for name, cell in cells]
    if not _owned(value):
        return []
    slots = [getattr(kind, "__slots__", ()) for kind in type(value).__mro__]
    names = {n for s in slots for n in ((s,) if isinstance(s, str) else s) if n[:2] != "__"}
    held = [(f".{name}", getattr(value, name, None)) for name in sorted(names)]
    try:
        return [*held, *((f".{k}", v) for k, v in vars(value).items())]
    except TypeError:  # slots only
        return held


def _contents(cell: types.CellType) -> object:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not filled yet
        return None


def _owned(value: object) -> bool:
    """An instance of the engine's own (or a library's) class, worth looking inside."""
    if isinstance(value, (type, types.ModuleType, types.BuiltinFunctionType)):
        return False
    return type(value).__module__.partition(".")[0] not in _NOT_OWNED


def _weak(loaded: object) -> list[tuple[str, weakref.ref[object]]]:
    """Weak references to what ``reachable`` finds (in a function of its own, so that no
    local variable of the check keeps the last one alive)."""
    refs = []
    for path, value in reachable(loaded):
        try:
            refs.append((path, weakref.ref(value)))
        except TypeError:
            continue
    return refs


def unload_releases(subject: Subject) -> None:
    service = subject.service()
    handle = subject.load(service)
    if subject.capability is not None:
        subject.audio(handle, SEED, subject.sentence)
    refs = _weak(handle.loaded_engine)
    service.unload()
    del handle, service
    gc.collect()
    alive = [(path, ref()) for path, ref in refs if ref() is not None]
    if alive:
        alive.sort(key=lambda item: (item[0].count(".") + item[0].count("["), item[0]))
        names = ", ".join(f"{path} ({type(value).__name__})" for path, value in alive[:5])
        more = f" and {len(alive) - 5} more" if len(alive) > 5 else ""
        raise Fail(
            "the loaded engine, its handles' modules and their tensors freed after unload",
            f"still referenced: {names}{more} (gc.get_referrers shows by whom)",
        )
    # Tensors the engine keeps apart from the loaded engine (a module-level cache of weights,
    # a class attribute), counted in the fresh process from before the load to after unload.
    memory = report(subject).get("memory", {}).get("unload", [])
    if memory:
        raise Fail(
            "every torch tensor made since the load freed after unload (fresh process)",
            "; ".join(memory),
        )


def no_threads(subject: Subject) -> None:
    left = phases_report(subject, "threads", ("unload",))
    if left:
        raise Fail(
            "no thread left running after unload that did not run before the engine's import "
            "(fresh process)",
            "; ".join(left),
        )


def _leaks(subject: Subject, *keys: str) -> list[str]:
    """What the fresh process left under ``keys`` after the leak phases, each once, under the
    phase after which it first showed: ``second call: pid 12 (S sleep), pid 13 (S sleep)``."""
    first: dict[str, str] = {}
    for key in keys:
        for line in phases_report(subject, key, _LEAK_PHASES):
            phase, _, item = line.partition(": ")
            first.setdefault(item, phase)
    grouped: dict[str, list[str]] = {}
    for item, phase in list(first.items())[:_MAX_LISTED]:
        grouped.setdefault(phase, []).append(item)
    listed = [f"{phase}: {', '.join(grouped[phase])}" for phase in _LEAK_PHASES if phase in grouped]
    more = len(first) - _MAX_LISTED
    return [*listed, f"and {more} more"] if more > 0 else listed


def no_processes(subject: Subject) -> None:
    left = _leaks(subject, "processes")
    if left:
        raise Fail(
            "no child process left behind by a call, a close, a cancel or unload (fresh process; "
            "a daemonised grandchild counts)",
            "; ".join(left),
        )


def no_temp_files(subject: Subject) -> None:
    left = _leaks(subject, "files", "sockets")
    if left:
        raise Fail(
            "no file left behind in the temporary folder, the working folder or HOME, and no "
            "socket left open, by a call, a close, a cancel or unload (fresh process, folders of "
            "its own)",
            "; ".join(left),
        )


def _tracked_bytes(service: object) -> int:
    """What the memory manager tracks; 0 while no engine that uses torch has started it."""
    runtime = service.started_runtime  # type: ignore[attr-defined]  # service: a RuntimeService
    rows = runtime.manager.residency() if runtime is not None else []
    return sum(
        int(r["resident_bytes"]) + int(r["streamed_bytes"]) + int(r["host_bytes"]) for r in rows
    )


def reload(subject: Subject) -> None:
    service = subject.service()
    before = _tracked_bytes(service)
    first = subject.audio(subject.load(service), SEED, subject.sentence)
    service.unload()
    between = _tracked_bytes(service)
    second = subject.audio(subject.load(service), SEED, subject.sentence)
    service.unload()
    after = _tracked_bytes(service)
    if subject.manifest.deterministic and first != second:
        raise Fail(
            "the first load's audio from a load after unload (one host)", differ(first, second)
        )
    if (between, after) != (before, before):
        raise Fail(
            f"the memory the manager tracks back to {before} B after each unload",
            f"{between} B after the first unload, {after} B after the second",
        )


CHECKS = (
    Check(
        "resources.unload_releases",
        "After unload, the loaded engine, its modules (handles included) and every tensor made "
        "since the load are freed.",
        "A reference kept after unload keeps the weights in device and host memory; a module "
        "global or class attribute (a cache of weights) holds them for the process's life. "
        "Counted in a fresh process: the tensors alive after unload against before the load.",
        "Drop references in LoadedEngine.unload(); keep no module or tensor in globals, class "
        "attributes or caches (or clear them at unload); the failure names the holder.",
        "core",
        unload_releases,
        requires=STREAM_OUTPUT,
    ),
    Check(
        "resources.no_threads",
        "No thread the engine started, at import or later, is left running after unload.",
        "Leaked threads keep the process alive and the device busy. Measured in a fresh "
        "process against the threads that ran before the engine's module was imported.",
        "Join worker threads when the call or the model ends; start none at import.",
        "core",
        no_threads,
        requires=STREAM_OUTPUT,
    ),
    Check(
        "resources.no_processes",
        "No child process is left behind by a call, an early close, a cancel or unload.",
        "An engine wrapping a program that never kills or reaps it fills the process table and "
        "keeps working after the caller gave up. The fresh process adopts orphans (a subreaper, "
        "on Linux), so a helper that daemonised itself (double fork, `sh -c 'cmd &'`) counts.",
        "Kill the program on cancel and close (try/finally around the stream), wait() for it, "
        "and stop long-lived helpers in LoadedEngine.unload().",
        "core",
        no_processes,
        requires=STREAM_OUTPUT,
    ),
    Check(
        "resources.no_temp_files",
        "No file (in the temporary folder, the working folder or HOME) and no open socket is "
        "left behind by a call, an early close, a cancel or unload.",
        "A server runs for months; files left per call fill its disk, sockets its descriptors "
        "and ports. The fresh process has a temporary folder, working folder and HOME of its "
        "own, listed after each phase with its open sockets.",
        "Use tempfile.TemporaryDirectory() (or remove files in finally), also on cancel; write "
        "nothing into the working folder or ~; close sockets (with-statement) when the call or "
        "the model ends.",
        "core",
        no_temp_files,
        requires=STREAM_OUTPUT,
    ),
    Check(
        "resources.reload",
        "Load, unload and load again gives the first load's audio; tracked memory returns.",
        "A server unloads and reloads models as memory and settings change; a reload must be "
        "the same model.",
        "Never transform a cached checkpoint in place; rebuild load state from scratch; "
        "give back every handle on unload.",
        "core",
        reload,
        ("streaming",),
        requires=(*STREAM_OUTPUT, "determinism.fresh_loads", "determinism.same_handle"),
    ),
)
