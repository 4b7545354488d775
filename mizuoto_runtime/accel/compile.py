"""torch.compile for hot modules (``compute.compile``), falling back to eager when it fails.

Compilation is an optimisation, never a requirement: a compiler error (an unsupported op, a
missing C++ toolchain, a backend bug) turns into one warning on the request and eager calls from
then on, and the call that hit it still returns eager's answer. The module is compiled with
``dynamic=True`` (one graph for every sequence length rather than one per length) and
``fullgraph=True``, so a failure happens while tracing or compiling, before any part of the call has
run: nothing (a cache write, a draw) is done twice when eager takes over.

Compiled code does not see the request's context, so attention inside it runs each site's reference,
which the compiler lowers to its own kernel; ``ctx.applied["compile"][name]`` says which way each
call went.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal, overload

import torch

from mizuoto_runtime.context import current_context

__all__ = ["Compiled", "compile_module"]

log = logging.getLogger(__name__)
COMPILE = "compute.compile"


def _compiler_errors() -> tuple[type[BaseException], ...]:
    from torch._dynamo.exc import TorchDynamoException

    return (TorchDynamoException,)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def _describe(error: BaseException) -> str:
    """The error and, for a backend failure, what the backend itself raised."""
    inner = getattr(error, "inner_exception", None) or error.__cause__
    what = f"{type(error).__name__}: {_first_line(error)}"
    if inner is not None:
        what += f" {type(inner).__name__}: {_first_line(inner)}"
    return what[:300]


class Compiled:
    """A module behind ``torch.compile``; attribute access reaches the module itself.

    ``fallback`` is None while compiled calls work, else why calls now run eagerly.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        name: str,
        *,
        backend: str | Callable[..., Any] = "inductor",
        options: dict[str, Any] | None = None,
    ) -> None:
        self.module = module
        self.name = name
        self.fallback: str | None = None
        self._compiled = torch.compile(
            module, dynamic=True, fullgraph=True, backend=backend, options=options
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ctx = current_context()
        if self.fallback is None:
            try:
                out = self._compiled(*args, **kwargs)
            except _compiler_errors() as error:
                self.fallback = _describe(error)
                message = f"{COMPILE} for {self.name} failed ({self.fallback}); running eagerly"
                if ctx is not None:
                    ctx.warn(message)
                else:
                    log.warning("%s", message)
            else:
                if ctx is not None:
                    ctx.applied.setdefault("compile", {})[self.name] = "torch.compile"
                return out
        if ctx is not None:
            ctx.applied.setdefault("compile", {})[self.name] = f"eager ({self.fallback})"
        return self.module(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # only reached for names Compiled itself lacks: the module's own attributes and methods
        return getattr(self.__dict__["module"], name)


@overload
def compile_module(
    module: torch.nn.Module,
    enabled: Literal[True],
    name: str,
    *,
    backend: str | Callable[..., Any] = ...,
    options: dict[str, Any] | None = ...,
) -> Compiled: ...
@overload
def compile_module(
    module: torch.nn.Module,
    enabled: bool,
    name: str,
    *,
    backend: str | Callable[..., Any] = ...,
    options: dict[str, Any] | None = ...,
) -> torch.nn.Module | Compiled: ...
def compile_module(
    module: torch.nn.Module,
    enabled: bool,
    name: str,
    *,
    backend: str | Callable[..., Any] = "inductor",
    options: dict[str, Any] | None = None,
) -> torch.nn.Module | Compiled:
    """``module`` compiled when ``enabled`` (normally the request's ``ctx.compute.compile``).

    Otherwise the module itself. ``name`` labels the module in ``applied`` and warnings.
    ``backend`` and ``options`` go to ``torch.compile`` (per call, never through global config).
    """
    if not enabled:
        return module
    return Compiled(module, name, backend=backend, options=options)
