"""ModelHandle: one module with weights, split into parts the memory manager can place.

An engine wraps each weighted component it loads (a decoder, a codec) in a handle and reads only
``handle.module``. The manager decides, per request phase, which parts live on the load device
(*resident*), which stay in host memory and are copied in as they run (*streamed*), and which sit
in host memory unused (*host*: an idle component that gave its memory back). A part is one unit
(by default a repeated block such as a decoder layer, see ``mizuoto_runtime.memory.units``) or the
*base*: every tensor that belongs to no unit (embeddings, heads, norms), which is resident
whenever the handle runs.

Tensors move by assigning ``tensor.data``, so the Parameter objects an engine holds (or a decoder
gathered into a weights tuple) stay the same objects and see the new storage.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

from mizuoto_runtime.memory.units import discover_units, unit_tensors

if TYPE_CHECKING:
    import torch
    from torch import nn

    from mizuoto_runtime.devices.meter import MemoryMeter

__all__ = ["HOST", "RESIDENT", "STREAMED", "ModelHandle", "Part", "PartState", "indexed_device"]

PartState = Literal["resident", "streamed", "host"]
RESIDENT: PartState = "resident"
STREAMED: PartState = "streamed"
HOST: PartState = "host"
_KINDS = ("sequence", "oneshot")


class Part:
    """A unit (or the base) of a handle: its tensors, their bytes, and where they are."""

    __slots__ = ("handle", "index", "module", "nbytes", "pinned", "state", "tensors")

    def __init__(
        self,
        handle: ModelHandle,
        index: int,
        module: nn.Module | None,
        tensors: list[torch.Tensor],
        state: PartState,
    ) -> None:
        self.handle = handle
        self.index = index  # position in handle.units; -1 for the base
        self.module = module
        self.tensors = tensors
        self.nbytes = sum(t.nbytes for t in tensors)
        self.state: PartState = state
        self.pinned = False

    @property
    def streamable(self) -> bool:
        return self.index >= 0

    def __repr__(self) -> str:
        what = "base" if self.index < 0 else f"unit {self.index}"
        return f"<{self.handle.name} {what}: {self.nbytes} B {self.state}>"


class ModelHandle:
    """A weighted module as the memory manager sees it. Engines read only ``.module``.

    ``name`` is what the loaded-models list shows (``"codeclm/tiny:decoder"``); ``kind`` is
    ``"sequence"`` for autoregressive models (their units run once per generated token, so
    streaming them costs the most: of handles last used together, they give memory back last)
    and ``"oneshot"`` otherwise.
    The module may already be on ``load_device`` (fully resident, the usual state right after
    ``Engine.load``) or on ``offload_device`` (the manager places it on first use). ``units``
    overrides the discovered streamable blocks; ``units=()`` makes the whole module one part.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        name: str,
        load_device: str,
        offload_device: str = "cpu",
        kind: Literal["sequence", "oneshot"] = "oneshot",
        units: Sequence[nn.Module] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name: expected a non-empty string, got {name!r}")
        if kind not in _KINDS:
            raise ValueError(f"kind: expected 'sequence' or 'oneshot', got {kind!r}")

        self.module = module
        self.name = name
        self.load_device = indexed_device(load_device)
        self.offload_device = indexed_device(offload_device)
        self.kind: Literal["sequence", "oneshot"] = kind
        self.units: tuple[nn.Module, ...] = tuple(
            discover_units(module) if units is None else units
        )
        groups, rest = unit_tensors(module, self.units)
        self.unit_parts = tuple(
            Part(self, i, unit, tensors, self._where(tensors))
            for i, (unit, tensors) in enumerate(zip(self.units, groups, strict=True))
        )
        self.base = Part(self, -1, None, rest, self._where(rest))
        self.parts: tuple[Part, ...] = (self.base, *self.unit_parts)
        self.size_bytes = sum(p.nbytes for p in self.parts)
        self._meter: _Charges | None = None

    def bind(self, meter: MemoryMeter | None) -> None:
        """Charge every move to the load device's ``meter`` (the manager binds it on register).

        ``meter.charge(+n)`` runs before ``n`` bytes arrive and may raise
        ``torch.OutOfMemoryError``, as a real allocation would; the part then stays where it was.
        """
        self._meter = meter

    def count_with(self, account: Callable[[int], None] | None) -> None:
        """Deprecated: ``bind(meter)``."""
        warnings.warn(
            "ModelHandle.count_with is deprecated, use ModelHandle.bind(meter); "
            "it goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        self._meter = None if account is None else _Account(account)

    def _where(self, tensors: list[torch.Tensor]) -> PartState:
        on_device = [str(t.device) == self.load_device for t in tensors]
        if all(on_device):
            return RESIDENT
        if not any(on_device):
            return HOST
        raise ValueError(
            f"{self.name}: a part is split between {self.load_device} and another device; "
            "move the whole module to one device before wrapping it"
        )

    def _bytes(self, state: PartState) -> int:
        return sum(p.nbytes for p in self.parts if p.state == state)

    @property
    def resident_bytes(self) -> int:
        """Bytes resident on the load device."""
        return self._bytes(RESIDENT)

    @property
    def loaded_bytes(self) -> int:
        """Deprecated: ``resident_bytes``."""
        warnings.warn(
            "ModelHandle.loaded_bytes is deprecated, use ModelHandle.resident_bytes; "
            "it goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.resident_bytes

    @property
    def streamed_bytes(self) -> int:
        """Bytes kept in host memory and copied to the device as their units run."""
        return self._bytes(STREAMED)

    @property
    def host_bytes(self) -> int:
        """Bytes in host memory that are not streamed (given back while the model was idle)."""
        return self._bytes(HOST)

    def move(self, part: Part, state: PartState) -> int:
        """Put ``part`` in ``state``; returns the change in device bytes (+ moved in, - out).

        Host copies are pinned when the load device is CUDA (a pageable copy if pinning fails),
        so that streaming them and loading them back is an asynchronous DMA.
        """
        was_on_device = part.state == RESIDENT
        goes_on_device = state == RESIDENT
        arriving = goes_on_device and not was_on_device
        meter = self._meter
        if arriving and meter is not None:
            meter.charge(part.nbytes)
        try:
            self._place(part, was_on_device, goes_on_device, state)
        except BaseException:
            if arriving and meter is not None:
                meter.charge(-part.nbytes)
            raise
        part.state = state
        if was_on_device == goes_on_device:
            return 0
        if meter is not None and not goes_on_device:
            meter.charge(-part.nbytes)
        return part.nbytes if goes_on_device else -part.nbytes

    def _place(
        self, part: Part, was_on_device: bool, goes_on_device: bool, state: PartState
    ) -> None:
        if was_on_device != goes_on_device:
            with _normal_tensors():
                target = self.load_device if goes_on_device else self.offload_device
                pin = not goes_on_device and self.load_device.startswith("cuda")
                # Every copy first, then every assignment: a failed allocation leaves the part
                # whole where it was.
                moved = [_copy_to(tensor.data, target, pin) for tensor in part.tensors]
                for tensor, (copy, _) in zip(part.tensors, moved, strict=True):
                    tensor.data = copy
                part.pinned = pin and all(ok for _, ok in moved)
        elif state == STREAMED and self.load_device.startswith("cuda") and not part.pinned:
            with _normal_tensors():  # streamed copies must be pinned for asynchronous copies
                moved = [_copy_to(tensor.data, "cpu", True) for tensor in part.tensors]
                for tensor, (copy, _) in zip(part.tensors, moved, strict=True):
                    tensor.data = copy
                part.pinned = all(ok for _, ok in moved)

    def reload_cost(self, part: Part) -> float:
        """Relative cost of bringing ``part`` back: pinned host memory is cheaper than pageable."""
        return part.nbytes * (1.0 if part.pinned else 2.0)

    def __repr__(self) -> str:
        return (
            f"<ModelHandle {self.name} on {self.load_device}: {self.resident_bytes} resident, "
            f"{self.streamed_bytes} streamed, {self.host_bytes} host of {self.size_bytes} B>"
        )


class _Charges(Protocol):
    def charge(self, delta: int) -> None: ...


class _Account:
    """A ``count_with`` callable, charged as a meter would be."""

    __slots__ = ("charge",)

    def __init__(self, account: Callable[[int], None]) -> None:
        self.charge = account


def indexed_device(device: str | torch.device) -> str:
    """``"cuda"`` as ``"cuda:<current>"``, the way tensors on it name their device."""
    import torch

    device = torch.device(device)
    if device.type in ("cpu", "meta") or device.index is not None:
        return str(device)
    backend = getattr(torch, device.type, None)
    index = backend.current_device() if hasattr(backend, "current_device") else 0
    return f"{device.type}:{index}"


def _copy_to(tensor: torch.Tensor, device: str, pin: bool) -> tuple[torch.Tensor, bool]:
    """``tensor`` on ``device`` (a no-op when already there); the flag says whether it pinned."""
    import torch

    if str(tensor.device) == device and not (pin and not tensor.is_pinned()):
        return tensor, not pin or tensor.is_pinned()
    if not pin:
        return tensor.to(device, copy=True), True
    try:
        host = torch.empty_like(tensor, device=device, pin_memory=True)
    except RuntimeError:
        return tensor.to(device, copy=True), False
    host.copy_(tensor)
    return host, True


@contextlib.contextmanager
def _normal_tensors() -> Iterator[None]:
    """Weights must stay normal tensors even when moved inside ``torch.inference_mode()``."""
    import torch

    with torch.inference_mode(False):
        yield
