"""snapshot() notices each kind of process-state change, and names it; a culprit watch names
who made it."""

from __future__ import annotations

import gc
import importlib
import json
import logging
import os
import random
import signal
import socket
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from mizuoto_contract.snapshot import quick_state, snapshot, watch_culprits


def _restore_torch_rng(state=torch.get_rng_state()):  # noqa: B008 - read once at import
    torch.set_rng_state(state)


CHANGES: dict[str, tuple[Callable[[], object], str]] = {
    # name: (a change a careless engine makes, the entry the diff must name)
    "torch seed": (lambda: torch.manual_seed(1), "torch.rng.cpu"),
    "torch draw": (lambda: torch.rand(1), "torch.rng.cpu"),
    "numpy seed": (lambda: np.random.seed(1), "numpy.random.state"),
    "random seed": (lambda: random.seed(1), "random.state"),
    "default dtype": (lambda: torch.set_default_dtype(torch.float64), "torch.default_dtype"),
    "deterministic": (
        lambda: torch.use_deterministic_algorithms(True),
        "torch.deterministic_algorithms",
    ),
    "cudnn flag": (
        lambda: setattr(torch.backends.cudnn, "benchmark", True),
        "torch.backends.cudnn.benchmark",
    ),
    "tf32 flag": (
        lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True),
        "torch.backends.cuda.matmul.allow_tf32",
    ),
    "matmul precision": (
        lambda: torch.set_float32_matmul_precision("medium"),
        "torch.float32_matmul_precision",
    ),
    "threads": (
        lambda: torch.set_num_threads(max(1, torch.get_num_threads() - 1) or 1),
        "torch.num_threads",
    ),
    "grad mode": (lambda: torch.set_grad_enabled(False), "torch.grad_enabled"),
    "environment": (
        lambda: os.environ.__setitem__("MIZUOTO_SNAPSHOT_TEST", "1"),
        "os.environ[MIZUOTO_SNAPSHOT_TEST]",
    ),
    "cwd": (lambda: os.chdir("/"), "os.cwd"),
    "sys.path": (lambda: sys.path.append("/nowhere"), "sys.path"),
    "logging": (lambda: logging.basicConfig(level=logging.DEBUG, force=True), "logging.root.level"),
    "logger": (
        lambda: logging.getLogger("mizuoto.snapshot.test").setLevel(logging.ERROR),
        "logging.logger[mizuoto.snapshot.test]",
    ),
    "handler": (
        lambda: logging.getLogger().addHandler(logging.NullHandler()),
        "logging.root.handlers",
    ),
    "warnings": (lambda: warnings.simplefilter("ignore"), "warnings.filters"),
    "recursion limit": (
        lambda: sys.setrecursionlimit(sys.getrecursionlimit() + 7),
        "sys.recursionlimit",
    ),
    "switch interval": (lambda: sys.setswitchinterval(0.0123), "sys.switchinterval"),
    "excepthook": (lambda: setattr(sys, "excepthook", lambda *a: None), "sys.excepthook"),
    "socket timeout": (lambda: socket.setdefaulttimeout(3.5), "socket.default_timeout"),
    "inductor config": (
        lambda: setattr(_inductor_config(), "max_autotune", True),
        "torch._inductor.config",
    ),
}


def _inductor_config():
    import torch._inductor.config as config

    return config


@pytest.fixture
def restore():
    """Put back everything the changes below touch, whatever happens."""
    saved = (
        torch.get_rng_state(),
        np.random.get_state(),
        random.getstate(),
        torch.get_default_dtype(),
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cuda.matmul.allow_tf32,
        torch.get_float32_matmul_precision(),
        torch.get_num_threads(),
        torch.is_grad_enabled(),
        os.getcwd(),
        list(sys.path),
        list(warnings.filters),
        logging.getLogger().level,
        list(logging.getLogger().handlers),
        sys.getrecursionlimit(),
        sys.getswitchinterval(),
        sys.excepthook,
        socket.getdefaulttimeout(),
    )
    yield
    (
        rng,
        np_state,
        py_state,
        dtype,
        deterministic,
        benchmark,
        tf32,
        precision,
        threads,
        grad,
        cwd,
        path,
        filters,
        level,
        handlers,
        limit,
        interval,
        hook,
        timeout,
    ) = saved
    sys.setrecursionlimit(limit)
    sys.setswitchinterval(interval)
    sys.excepthook = hook
    socket.setdefaulttimeout(timeout)
    if "torch._inductor.config" in sys.modules:
        sys.modules["torch._inductor.config"].max_autotune = False
    torch.set_rng_state(rng)
    np.random.set_state(np_state)
    random.setstate(py_state)
    torch.set_default_dtype(dtype)
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.set_float32_matmul_precision(precision)
    torch.set_num_threads(threads)
    torch.set_grad_enabled(grad)
    os.chdir(cwd)
    sys.path[:] = path
    warnings.filters[:] = filters
    root = logging.getLogger()
    root.setLevel(level)
    root.handlers[:] = handlers
    os.environ.pop("MIZUOTO_SNAPSHOT_TEST", None)
    logging.getLogger("mizuoto.snapshot.test").setLevel(logging.NOTSET)


def test_an_untouched_process_has_no_diff():
    assert snapshot().diff(snapshot()) == []


@pytest.mark.parametrize("kind", CHANGES)
def test_each_kind_of_change_is_named(kind, restore):
    change, entry = CHANGES[kind]
    if kind == "threads" and torch.get_num_threads() == 1:
        change = lambda: torch.set_num_threads(2)  # noqa: E731
    before = snapshot()
    change()
    names = [c.name for c in before.diff(snapshot())]
    assert entry in names, f"{kind}: diff named {names}"


def test_the_diff_shows_before_and_after():
    before = snapshot()
    os.environ["MIZUOTO_SNAPSHOT_TEST"] = "x"
    try:
        (change,) = before.diff(snapshot())
    finally:
        del os.environ["MIZUOTO_SNAPSHOT_TEST"]
    assert (change.before, change.after) == (None, "x")
    assert str(change) == "os.environ[MIZUOTO_SNAPSHOT_TEST]: None -> 'x'"


def test_a_private_generator_changes_nothing():
    before = snapshot()
    torch.rand(3, generator=torch.Generator().manual_seed(0))
    np.random.default_rng(0).random(3)
    assert before.diff(snapshot()) == []


def test_a_torch_config_module_at_its_defaults_is_no_entry(restore):
    """A fresh process's baseline may predate torch.compile's lazy import of its config
    modules: only entries set away from their defaults are state."""
    config = _inductor_config()
    assert "torch._inductor.config" not in snapshot().entries
    config.max_autotune = True
    assert "torch._inductor.config" in snapshot().entries


def _from_another_thread(change: Callable[[], object]) -> None:
    worker = threading.Thread(target=change)
    worker.start()
    worker.join()


_REAL_JSON_DUMPS = json.dumps
_REAL_TORCH_LOAD = torch.load
_REAL_MODULE_CALL = torch.nn.Module.__call__
_THRESHOLD = gc.get_threshold()
_SEEN_ERR = np.geterr()
_THREADS = torch.get_num_threads()
_UMASK = os.umask(0o022)
os.umask(_UMASK)

# name: (a change an engine or a library it imports makes, the entry the diff must name, undo)
PROCESS_CHANGES: dict[str, tuple[Callable[[], object], str, Callable[[], object]]] = {
    "gc threshold": (
        lambda: gc.set_threshold(50_000, 20, 20),
        "gc.threshold",
        lambda: gc.set_threshold(*_THRESHOLD),
    ),
    "gc disabled": (gc.disable, "gc.enabled", gc.enable),
    "numpy seterr": (
        lambda: np.seterr(all="raise"),
        "numpy.seterr",
        lambda: np.seterr(**_SEEN_ERR),
    ),
    "threads of new threads": (  # torch's count is per thread: set on a thread of the engine's
        lambda: _from_another_thread(lambda: torch.set_num_threads(1 if _THREADS > 1 else 2)),
        "torch.num_threads.new_thread",
        lambda: _from_another_thread(lambda: torch.set_num_threads(_THREADS)),
    ),
    "signal handler": (
        lambda: signal.signal(signal.SIGUSR1, lambda *a: None),
        "signal.SIGUSR1",
        lambda: signal.signal(signal.SIGUSR1, signal.SIG_DFL),
    ),
    "replaced torch.load": (
        lambda: setattr(torch, "load", lambda *a, **k: _REAL_TORCH_LOAD(*a, **k)),
        "callable:torch.load",
        lambda: setattr(torch, "load", _REAL_TORCH_LOAD),
    ),
    "replaced json.dumps": (
        lambda: setattr(json, "dumps", lambda *a, **k: _REAL_JSON_DUMPS(*a, **k)),
        "callable:json.dumps",
        lambda: setattr(json, "dumps", _REAL_JSON_DUMPS),
    ),
    "patched Module.__call__": (
        lambda: setattr(torch.nn.Module, "__call__", lambda self, *a, **k: None),
        "callable:torch.nn.Module.__call__",
        lambda: setattr(torch.nn.Module, "__call__", _REAL_MODULE_CALL),
    ),
}
if sys.platform.startswith("linux"):
    PROCESS_CHANGES["umask"] = (lambda: os.umask(0o077), "os.umask", lambda: os.umask(_UMASK))
if torch.set_flush_denormal(False):  # where the CPU can flush denormals at all
    PROCESS_CHANGES["flush denormal"] = (
        lambda: torch.set_flush_denormal(True),
        "torch.flush_denormal",
        lambda: torch.set_flush_denormal(False),
    )


@pytest.mark.parametrize("kind", PROCESS_CHANGES)
def test_each_kind_of_process_change_is_named(kind):
    change, entry, undo = PROCESS_CHANGES[kind]
    before = snapshot()
    try:
        change()
        names = [c.name for c in before.diff(snapshot())]
    finally:
        undo()
    assert entry in names, f"{kind}: diff named {names}"
    assert before.diff(snapshot()) == [], f"{kind}: not undone"


def test_a_callable_that_appears_is_no_change_and_one_removed_is():
    before = snapshot()
    json.mizuoto_snapshot_test = lambda: None  # a name a library adds
    try:
        assert before.diff(snapshot()) == []
        added = snapshot()
    finally:
        del json.mizuoto_snapshot_test
    assert [c.name for c in added.diff(snapshot())] == ["callable:json.mizuoto_snapshot_test"]


def test_a_snapshot_changes_nothing_it_reads():
    first = snapshot()
    assert first.diff(snapshot()) == [] and snapshot().diff(first) == []


CORPUS = Path(__file__).resolve().parent / "corpus"
_DEPENDENCY = "chatty_dependency"  # a library that sets a variable and draws at import
_ENGINE = "mizuoto_broken.load_global_state__dependency"  # an engine module importing it


@pytest.fixture
def fresh_corpus(monkeypatch: pytest.MonkeyPatch):
    """The corpus on the path, the dependency and its engine module not imported yet (put back
    as they were afterwards)."""
    monkeypatch.syspath_prepend(str(CORPUS))
    for name in (_DEPENDENCY, _ENGINE):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    dependency = sys.modules.get(_DEPENDENCY)
    if dependency is not None:
        dependency.restore()


def test_a_watch_names_the_module_whose_import_changed_state(fresh_corpus):
    before = snapshot()
    watch = watch_culprits()
    try:
        engine = importlib.import_module(_ENGINE)
        changes = {c.name: c for c in before.diff(snapshot())}
    finally:
        watch.stop()
    culprit = f"during the import of {_DEPENDENCY} (imported by {_ENGINE})"
    assert changes["os.environ[CHATTY_DEPENDENCY_WORKERS]"].culprit == culprit
    assert changes["random.state"].culprit == culprit
    assert str(changes["random.state"]).endswith(f"({culprit})")
    # The modules keep their own loaders, as if no watch had run.
    assert type(engine.__loader__).__name__ == "SourceFileLoader"
    assert engine.__spec__.loader is engine.__loader__


@pytest.mark.skipif(sys.gettrace() is not None, reason="a debugger or coverage traces already")
def test_a_watch_names_the_line_of_a_package_the_host_imported(fresh_corpus):
    watch = watch_culprits()
    try:
        dependency = importlib.import_module(_DEPENDENCY)  # imported by no module: the host
        after_import = snapshot()  # from here on, the package's functions are traced
        dependency.restore()  # a function of the package changes state
        changes = {c.name: c for c in after_import.diff(snapshot())}
    finally:
        watch.stop()
    assert sys.gettrace() is None
    path = Path(dependency.__file__).name
    assert changes["random.state"].culprit.startswith(f"at {path}:")
    assert changes["random.state"].culprit.endswith(" in restore")
    assert changes["os.environ[CHATTY_DEPENDENCY_WORKERS]"].culprit.endswith(" in restore")


def test_snapshots_name_no_culprit_without_a_watch():
    watch = watch_culprits()
    watch.stop()
    before = snapshot()
    os.environ["MIZUOTO_SNAPSHOT_TEST"] = "x"
    try:
        (change,) = before.diff(snapshot())
    finally:
        del os.environ["MIZUOTO_SNAPSHOT_TEST"]
    assert change.culprit is None


def test_the_quick_reading_names_entries_of_the_snapshot():
    """What a watch compares at every line of an engine's code is named as the snapshot
    names it, so that a culprit lands on the entry the diff shows."""
    os.environ["MIZUOTO_SNAPSHOT_TEST"] = "x"
    try:
        names, entries = set(quick_state()), snapshot().entries
        assert "os.environ[MIZUOTO_SNAPSHOT_TEST]" in entries
    finally:
        del os.environ["MIZUOTO_SNAPSHOT_TEST"]
    assert names - {"os.environ"} <= set(entries)
