"""What the host gives engines that declare ``uses_torch=False``; the error where torch is missing.

Such an engine (one that wraps a program, or computes with numpy) is loaded and called without the
process's ``Runtime``: no torch import, no memory manager, no ``torch.inference_mode()``. Its
``Engine.load`` still receives a ``runtime`` argument, a stand-in that refuses every use with an
error that says how to get the real one, so an engine that declares too little fails clearly
rather than with ``'NoneType' object has no attribute``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from mizuoto_sdk.errors import ComputeUnavailable, EngineError

TORCH_INSTALL = "pip install 'mizuoto-sdk[torch]'"


class NoRuntime:
    """The ``runtime`` of an engine that declares ``uses_torch=False``: any use is an error."""

    def __init__(self, engine_id: str) -> None:
        self._engine_id = engine_id

    def __getattr__(self, name: str) -> NoReturn:
        if name.startswith("__"):  # copy, pickle and friends probe for these
            raise AttributeError(name)
        raise EngineError(
            f"engine {self._engine_id!r} declares uses_torch=False, so it has no runtime "
            f"(runtime.{name}); set uses_torch=True in its manifest to use the runtime",
            {"reason": "no_runtime", "attribute": name},
        )

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"NoRuntime({self._engine_id!r})"


def torch_missing(error: ImportError) -> ComputeUnavailable | None:
    """The error for a failed ``import torch``; None when ``error`` is about something else."""
    if (error.name or "").partition(".")[0] != "torch":
        return None
    return ComputeUnavailable(
        f"torch is not installed in this Python ({error}); engines that use torch need it: "
        f"{TORCH_INSTALL}",
        {"reason": "torch_missing", "install": TORCH_INSTALL},
    )


def declared_dtype(requested: str | None, supported: Sequence[str]) -> str:
    """The dtype of a torch-free engine's load: the one asked for if the manifest lists it, else
    the manifest's first (there is no device to ask what it can do)."""
    from mizuoto_runtime.devices.dtypes import requested_dtype

    return supported[0] if requested is None else requested_dtype(requested, supported)
