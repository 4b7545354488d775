"""A digest of the process-level state an engine call must leave as it found it.

``snapshot()`` reads global RNG states, torch's global switches, the environment, cwd, sys.path,
logging and warnings configuration into a flat mapping of named entries; ``diff`` names each entry
that changed. torch is read only when it is already imported, and CUDA only once initialised, so
taking a snapshot never changes what it measures.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import random
import signal
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping

import attrs


@attrs.frozen
class Change:
    name: str
    before: object
    after: object

    def __str__(self) -> str:
        return f"{self.name}: {self.before!r} -> {self.after!r}"


@attrs.frozen(eq=False)
class Snapshot:
    """Named entries of process state; large states (RNGs) are kept as digests."""

    entries: Mapping[str, object]

    def diff(self, later: Snapshot) -> list[Change]:
        """What differs in ``later``, entry by entry (missing entries show as None)."""
        names = sorted(set(self.entries) | set(later.entries))
        return [
            Change(name, self.entries.get(name), later.entries.get(name))
            for name in names
            if self.entries.get(name) != later.entries.get(name)
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
    for name, logger in sorted(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and (
            logger.level or logger.handlers or not logger.propagate or logger.disabled
        ):
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
    entries.update(_interpreter_entries())
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "random"):
        entries["numpy.random.state"] = _digest(numpy.random.get_state(legacy=False))
    for key, value in os.environ.items():
        entries[f"os.environ[{key}]"] = value
    for number in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(number)
        entries[f"signal.{signal.Signals(number).name}"] = getattr(handler, "__qualname__", handler)
    entries.update(_torch_entries())
    entries.update(_logging_entries())
    return Snapshot(entries)
