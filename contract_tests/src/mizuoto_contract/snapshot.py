"""A digest of the process-level state an engine call must leave as it found it.

``snapshot()`` reads global RNG states, torch's global switches, the environment, cwd, sys.path,
logging and warnings configuration, the garbage collector, floating-point modes (numpy's error
handling, denormals flushed to zero, observed by computing since torch has no getter), torch's
thread count as a new thread sees it, signal handlers, the umask, the C locale, and which object
each public callable of common modules is (a replaced ``torch.load``) into a flat mapping of named
entries; ``diff`` names each entry that changed. torch is read only when it is already imported,
and CUDA only once initialised, so taking a snapshot never changes what it measures.

While a culprit watch runs (``watch_culprits``, see ``mizuoto_contract.culprit``), each snapshot
also carries who changed its entries since the previous one: the module being imported or the line
of the engine's code.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import locale
import logging
import os
import pickle
import random
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from mizuoto_contract import culprit


@attrs.frozen
class Change:
    name: str
    before: object
    after: object
    culprit: str | None = None  # who changed it, where a culprit watch saw it

    def __str__(self) -> str:
        said = f"{self.name}: {self.before!r} -> {self.after!r}"
        return f"{said} ({self.culprit})" if self.culprit else said


@attrs.frozen(eq=False)
class Snapshot:
    """Named entries of process state; large states (RNGs) are kept as digests."""

    entries: Mapping[str, object]
    culprits: Mapping[str, str] = attrs.field(factory=dict)
    """Entry name -> who changed it since the previous snapshot (only while a watch runs)."""

    def diff(self, later: Snapshot) -> list[Change]:
        """What differs in ``later``, entry by entry (missing entries show as None).

        A callable that appears (a module imported, a name a library adds) is no change; one
        that is replaced or removed is.
        """
        names = sorted(set(self.entries) | set(later.entries))
        return [
            Change(name, self.entries.get(name), later.entries.get(name), later.culprits.get(name))
            for name in names
            if self.entries.get(name) != later.entries.get(name)
            and not (name.startswith(_CALLABLE) and name not in self.entries)
        ]


def _digest(value: object) -> str:
    if hasattr(value, "numpy"):  # a torch tensor, such as an RNG state
        value = value.numpy().tobytes()
    data = value if isinstance(value, bytes) else pickle.dumps(value, protocol=4)
    return hashlib.sha256(data).hexdigest()[:16]


def _torch_entries() -> Iterator[tuple[str, object]]:
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "get_rng_state"):
        return
    yield "torch.rng.cpu", _digest(torch.get_rng_state())
    if torch.cuda.is_initialized():
        for index, state in enumerate(torch.cuda.get_rng_state_all()):
            yield f"torch.rng.cuda:{index}", _digest(state)
    yield "torch.default_dtype", str(torch.get_default_dtype())
    if hasattr(torch, "get_default_device"):
        yield "torch.default_device", str(torch.get_default_device())
    yield "torch.deterministic_algorithms", torch.are_deterministic_algorithms_enabled()
    yield "torch.deterministic_warn_only", torch.is_deterministic_algorithms_warn_only_enabled()
    yield "torch.deterministic_debug_mode", torch.get_deterministic_debug_mode()
    yield "torch.float32_matmul_precision", torch.get_float32_matmul_precision()
    yield "torch.num_threads", torch.get_num_threads()
    yield "torch.num_interop_threads", torch.get_num_interop_threads()
    yield "torch.grad_enabled", torch.is_grad_enabled()
    yield "torch.inference_mode", torch.is_inference_mode_enabled()
    yield "torch.anomaly_enabled", torch.is_anomaly_enabled()
    backends = torch.backends
    flags: dict[str, Callable[[], object]] = {
        "cudnn.enabled": lambda: backends.cudnn.enabled,
        "cudnn.benchmark": lambda: backends.cudnn.benchmark,
        "cudnn.deterministic": lambda: backends.cudnn.deterministic,
        "cudnn.allow_tf32": lambda: backends.cudnn.allow_tf32,
        "cuda.matmul.allow_tf32": lambda: backends.cuda.matmul.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction": (
            lambda: backends.cuda.matmul.allow_fp16_reduced_precision_reduction
        ),
        "cuda.matmul.allow_bf16_reduced_precision_reduction": (
            lambda: backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        ),
        "cuda.flash_sdp": lambda: backends.cuda.flash_sdp_enabled(),
        "cuda.mem_efficient_sdp": lambda: backends.cuda.mem_efficient_sdp_enabled(),
        "cuda.math_sdp": lambda: backends.cuda.math_sdp_enabled(),
        "cuda.cudnn_sdp": lambda: backends.cuda.cudnn_sdp_enabled(),
        "cuda.preferred_linalg_library": lambda: str(backends.cuda.preferred_linalg_library()),
        "mkldnn.enabled": lambda: backends.mkldnn.enabled,
        "opt_einsum.enabled": lambda: backends.opt_einsum.enabled,
    }
    for name, read in flags.items():
        try:
            yield f"torch.backends.{name}", read()
        except (AttributeError, RuntimeError):
            continue
    for module_name in ("torch._dynamo.config", "torch._inductor.config"):
        config = sys.modules.get(module_name)
        if config is not None and hasattr(config, "get_config_copy"):
            changed = _changed_config(config)
            if changed:
                yield module_name, _digest(repr(changed))


_UNKNOWN = object()


def _changed_config(config: object) -> list[tuple[str, object]]:
    """The entries of a torch config module that differ from their defaults.

    Only those: a config module imported for the first time holds its defaults, so importing
    one (torch.compile does) is no change, and an entry set away from its default is one.
    """
    values = sorted(config.get_config_copy().items())  # type: ignore[attr-defined]  # a torch config module
    declared = getattr(config, "_config", None)  # torch's entries, each with its default
    if not isinstance(declared, dict):
        return values
    changed: list[tuple[str, object]] = []
    for name, value in values:
        default = getattr(declared.get(name), "default", _UNKNOWN)
        try:
            same = default is not _UNKNOWN and bool(value == default)
        except Exception:
            same = False
        if not same:
            changed.append((name, repr(value)))
    return changed


def _logging_entries() -> Iterator[tuple[str, object]]:
    root = logging.getLogger()
    yield "logging.root.level", root.level
    yield "logging.root.handlers", tuple(_handler(h) for h in root.handlers)
    yield "logging.disable", logging.root.manager.disable
    configured = [
        (name, logger)
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
        and (logger.level or logger.handlers or not logger.propagate or logger.disabled)
    ]
    for name, logger in sorted(configured, key=lambda item: item[0]):
        state = (
            logger.level,
            tuple(_handler(h) for h in logger.handlers),
            logger.propagate,
            logger.disabled,
        )
        yield f"logging.logger[{name}]", state


def _handler(handler: logging.Handler) -> tuple[str, int, int]:
    return type(handler).__name__, id(handler), handler.level


def _interpreter_entries() -> Iterator[tuple[str, object]]:
    """Interpreter-wide settings a library may flip: limits, hooks, default timeouts."""
    yield "sys.recursionlimit", sys.getrecursionlimit()
    yield "sys.switchinterval", sys.getswitchinterval()
    yield "sys.excepthook", _name(sys.excepthook)
    threading = sys.modules.get("threading")
    if threading is not None:
        yield "threading.excepthook", _name(threading.excepthook)
    socket = sys.modules.get("socket")
    if socket is not None:
        yield "socket.default_timeout", socket.getdefaulttimeout()


_CALLABLE = "callable:"
_WATCHED = (
    "builtins",
    "os",
    "os.path",
    "random",
    "time",
    "json",
    "pickle",
    "io",
    "shutil",
    "tempfile",
    "subprocess",
    "socket",
    "threading",
    "warnings",
    "logging",
    "numpy",
    "numpy.random",
    "torch",
    "torch.nn.functional",
)
"""Modules whose public callables engines and the libraries they import have been seen to replace
(read only once imported)."""


def _callable_entries() -> Iterator[tuple[str, object]]:
    """Which object each public callable of the watched modules is, and of torch.Tensor's and
    torch.nn.Module's methods: a wrapper put in its place is a change, whatever spelled it."""
    namespaces: list[tuple[str, Mapping[str, object]]] = []
    for module_name in _WATCHED:
        module = sys.modules.get(module_name)
        if module is not None:
            namespaces.append((module_name, vars(module)))
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "Tensor") and hasattr(torch, "nn"):
        namespaces.append(("torch.Tensor", vars(torch.Tensor)))
        namespaces.append(("torch.nn.Module", vars(torch.nn.Module)))
    for owner, namespace in namespaces:
        for name, value in list(namespace.items()):
            if (not name.startswith("_") or name in ("__call__", "__init__")) and callable(value):
                yield f"{_CALLABLE}{owner}.{name}", _name_and_id(value)


def _name_and_id(value: object) -> str:
    return f"{_name(value)} at {id(value):#x}"


def _float_entries() -> Iterator[tuple[str, object]]:
    """numpy's error handling, and whether this thread flushes denormals to zero (set by
    ``torch.set_flush_denormal``, which has no getter: a denormal that survives a multiply is
    the observation)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "geterr"):
        yield "numpy.seterr", tuple(sorted(numpy.geterr().items()))
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "tensor"):
        tiny = torch.tensor([1e-40], dtype=torch.float32)
        yield "torch.flush_denormal", bool((tiny * 1.0).item() == 0.0)


def _threads_entries() -> Iterator[tuple[str, object]]:
    """torch's thread count is per thread: how a thread started now sees it, besides this one."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "get_num_threads"):
        return
    seen: list[int] = []
    reader = threading.Thread(target=lambda: seen.append(torch.get_num_threads()), daemon=True)
    reader.start()
    reader.join()
    if seen:
        yield "torch.num_threads.new_thread", seen[0]


def _process_entries() -> Iterator[tuple[str, object]]:
    """The garbage collector, every catchable signal's handler, the umask, the C locale."""
    yield "gc.enabled", gc.isenabled()
    yield "gc.threshold", gc.get_threshold()
    for number in _SIGNALS:
        try:
            handler = signal.getsignal(number)
        except (ValueError, OSError):
            continue
        if handler is None:  # set from C, outside Python: not ours to read
            continue
        name = _SIGNAL_NAMES.get(number, f"SIG{number}")  # a real-time signal has no name
        yield f"signal.{name}", getattr(handler, "__qualname__", handler)
    umask = _umask()
    if umask is not None:
        yield "os.umask", umask
    with contextlib.suppress(locale.Error, ValueError):  # a platform that cannot say
        yield "locale.LC_ALL", locale.setlocale(locale.LC_ALL, None)  # None: a query


_SIGNALS = tuple(sorted(int(number) for number in signal.valid_signals()))
_SIGNAL_NAMES = {int(member): member.name for member in signal.Signals}


def _umask() -> str | None:
    """The umask as /proc shows it (reading it through os.umask would set it for a moment)."""
    try:
        with open(f"/proc/{os.getpid()}/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return line.split()[1]
    except OSError:
        return None
    return None


def _name(function: object) -> str:
    module = getattr(function, "__module__", None) or ""
    return f"{module}.{getattr(function, '__qualname__', repr(function))}"


def snapshot() -> Snapshot:
    """Read the process state now (cheap: a few milliseconds)."""
    entries: dict[str, object] = {
        "random.state": _digest(random.getstate()),
        "os.cwd": os.getcwd(),
        "sys.path": tuple(sys.path),
        "warnings.filters": tuple(map(repr, warnings.filters)),
    }
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "random"):
        entries["numpy.random.state"] = _digest(numpy.random.get_state(legacy=False))
    for key, value in os.environ.items():
        entries[f"os.environ[{key}]"] = value
    entries.update(_switch_entries())
    entries.update(_threads_entries())
    entries.update(_float_entries())
    entries.update(_callable_entries())
    return Snapshot(entries, culprits=culprit.take())


def _switch_entries() -> dict[str, object]:
    """The entries that cost microseconds, besides those ``quick_state`` reads: what a culprit
    watch compares around every module's import."""
    entries = dict(_interpreter_entries())
    entries.update(_process_entries())
    entries.update(_torch_entries())
    entries.update(_logging_entries())
    return entries


def quick_state() -> Mapping[str, object]:
    """The state engines and libraries change most often, raw: the global RNGs, the environment,
    the folder, the import path, the warning filters. Cheap enough (microseconds) to read at
    every line of an engine's code, and only compared, never shown. Its keys are the snapshot's
    entry names; ``os.environ``'s value maps each variable, for the entries ``os.environ[...]``."""
    state: dict[str, object] = {
        "random.state": random.getstate(),
        # os.environ's own mapping: copying it takes a microsecond, decoding every entry fifty.
        "os.environ": dict(getattr(os.environ, "_data", os.environ)),
        "os.cwd": os.getcwd(),
        "sys.path": tuple(sys.path),
        "warnings.filters": tuple(warnings.filters),
    }
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "random"):
        state["numpy.random.state"] = _numpy_generator(numpy)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_rng_state"):
        state["torch.rng.cpu"] = torch.get_rng_state().numpy().tobytes()
    return state


_MT19937_BYTES = 624 * 4 + 4  # numpy's mt19937_state: the key's words, then the position


def _numpy_generator(numpy: Any) -> object:
    """numpy's global generator state: an MT19937's words read where they lie (a microsecond)
    rather than copied into a dict (forty)."""
    generator: Any = getattr(numpy.random, "get_bit_generator", lambda: None)()
    if type(generator).__name__ == "MT19937":
        return ctypes.string_at(generator.ctypes.state_address, _MT19937_BYTES)
    return _digest(numpy.random.get_state(legacy=False))


def watch_culprits() -> culprit.Watch:
    """Start naming who changes the state from now on: each later snapshot carries, for every
    entry that changed, the module being imported or the line of the engine's code that changed
    it. The fresh process runs one through the engine's import and load; ``stop()`` it before
    the calls, whose code it would slow down."""
    return culprit.Watch.start(quick_state, _switch_entries)
