"""Units: the blocks a model can be streamed in, found in its module tree.

By default the units are a model's repeated blocks: the children of every ``ModuleList`` or
``Sequential`` whose children (two or more, all of one class) hold weights, such as a decoder's
layers. Such blocks run one after another, so while one computes the next can be copied in, and
they have equal shapes, so one set of staging buffers serves them all. An engine passes
``units=`` to ``ModelHandle`` to choose others.

A unit runs with its weights on the device either because its ``forward`` is called (the manager
then hooks it) or, for a model that computes with gathered tensors without calling its blocks,
because the model calls ``unit_gate.enter(unit)`` / ``unit_gate.exit(unit)`` around each block:
such a model has a ``unit_gate`` attribute, None unless some unit streams.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["UnitGate", "calls_gate", "discover_units", "route", "unit_tensors"]


class UnitGate(Protocol):
    """What a model with a ``unit_gate`` attribute calls around each of its units."""

    def enter(self, unit: nn.Module) -> None: ...

    def exit(self, unit: nn.Module) -> None: ...


def calls_gate(module: nn.Module) -> bool:
    """Whether ``module`` runs its units through ``unit_gate`` rather than their ``forward``."""
    return "unit_gate" in vars(module)


def route(
    module: nn.Module,
    units: Sequence[nn.Module],
    enter: Callable[[nn.Module], None],
    exit: Callable[[nn.Module], None],
) -> Callable[[], None]:
    """Have ``enter(unit)`` and ``exit(unit)`` called around every run of ``units`` of
    ``module``: through its ``unit_gate`` when it calls one, else through forward hooks (the
    exit hook runs also when the forward raises). Returns what undoes it."""
    if calls_gate(module):
        gate = _Gate({id(unit) for unit in units}, enter, exit)
        module.unit_gate = gate  # type: ignore[assignment]  # stub: Tensor | Module only

        def ungate() -> None:
            module.unit_gate = None  # type: ignore[assignment]  # as above

        return ungate
    hooks = []
    for unit in units:
        hooks.append(unit.register_forward_pre_hook(lambda m, args: enter(m)))
        hooks.append(unit.register_forward_hook(lambda m, args, out: exit(m), always_call=True))

    def unhook() -> None:
        for hook in hooks:
            hook.remove()

    return unhook


class _Gate:
    """The ``unit_gate`` of a routed module: units it was not given pass through."""

    __slots__ = ("_enter", "_exit", "_ids")

    def __init__(self, ids: set[int], enter: Callable[[Any], None], exit: Callable[[Any], None]):
        self._ids, self._enter, self._exit = ids, enter, exit

    def enter(self, unit: nn.Module) -> None:
        if id(unit) in self._ids:
            self._enter(unit)

    def exit(self, unit: nn.Module) -> None:
        if id(unit) in self._ids:
            self._exit(unit)


def discover_units(module: nn.Module) -> list[nn.Module]:
    """The repeated weighted blocks of ``module``, in execution (registration) order."""
    from torch import nn

    found: list[nn.Module] = []

    def weighted(m: nn.Module) -> bool:
        return any(True for _ in m.parameters()) or any(True for _ in m.buffers())

    def visit(m: nn.Module) -> None:
        children = list(m.children())
        if (
            isinstance(m, nn.ModuleList | nn.Sequential)
            and len(children) >= 2
            and len({type(c) for c in children}) == 1
            and all(weighted(c) for c in children)
        ):
            found.extend(children)
            return
        for child in children:
            visit(child)

    visit(module)
    return found


def unit_tensors(
    module: nn.Module, units: Sequence[nn.Module]
) -> tuple[list[list[torch.Tensor]], list[torch.Tensor]]:
    """Each unit's parameters and buffers, and the rest (the base), in registration order.

    A tensor shared between a unit and anything else (tied weights) stays in the base and is
    dropped from that unit, so streaming one unit never moves a tensor another part uses.
    """
    inside = {id(m) for unit in units for m in unit.modules()}
    outside = {
        id(t)
        for m in module.modules(remove_duplicate=False)
        if id(m) not in inside
        for t in _own(m)
    }
    owners: dict[int, int] = {}
    for index, unit in enumerate(units):
        for tensor in _tensors(unit):
            key = id(tensor)
            owners[key] = -1 if key in owners or key in outside else index
    groups: list[list[torch.Tensor]] = [[] for _ in units]
    rest: list[torch.Tensor] = []
    for tensor in _tensors(module):
        index = owners.get(id(tensor), -1)
        (rest if index < 0 else groups[index]).append(tensor)
    return groups, rest


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    params = [p for _, p in module.named_parameters(remove_duplicate=True)]
    return params + [b for _, b in module.named_buffers(remove_duplicate=True) if b is not None]


def _own(module: nn.Module) -> list[torch.Tensor]:
    """Tensors registered directly on ``module`` (not on its children)."""
    own = [p for p in module._parameters.values() if p is not None]
    return own + [b for b in module._buffers.values() if b is not None]
