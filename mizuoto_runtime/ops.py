"""Layers that cost nothing to construct, layers that compute in the input's precision, and seeded
initialisation for tests.

An engine builds its model from ``ops.default`` (or ``ops.cast``) and then loads a checkpoint over
it, so the random initialisation that ``torch.nn`` performs at construction is wasted work: for a
150M-parameter model it takes seconds and advances the process-global generator, which other
engines and the host share. ``ops.default`` layers are the ``torch.nn`` layers (same parameter
names, shapes, dtypes and forward; ``isinstance`` checks against ``torch.nn`` still hold) with
``reset_parameters`` a no-op: parameters are allocated with ``torch.empty`` and hold whatever the
allocator returned until a checkpoint or ``init_random`` fills them. ``device="meta"`` works as
in ``torch.nn``.

``ops.cast`` layers are the same, but cast weight and bias to the input's dtype and device on every
forward, for components stored in one precision and computed in another (weights kept in bf16 on
the host, computed in fp32 on the device). When they already match nothing is copied.

``init_random(module, generator)`` fills those layers with the distributions ``torch.nn`` would
use, drawing only from the generator it is given. Because a fresh ``torch.Generator`` seeded ``s``
yields what the default generator yields after ``torch.manual_seed(s)``, a model built from
``ops.default`` and filled by ``init_random`` equals, bit for bit, the same model built from
``torch.nn`` after ``torch.manual_seed(s)``, provided submodules are registered in the order they
are constructed (tied weights: tied after construction, the first layer's values kept).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["cast", "default", "init_random"]


class _NoInit:
    """Mixed in first: ``reset_parameters`` does nothing, so construction draws nothing."""

    def reset_parameters(self) -> None:
        """Left empty on purpose: weights come from a checkpoint or ``init_random``."""


class default:
    """``torch.nn`` layers without initialisation: construction allocates and draws nothing."""

    __slots__ = ()

    class Linear(_NoInit, nn.Linear):
        pass

    class Conv1d(_NoInit, nn.Conv1d):
        pass

    class Conv2d(_NoInit, nn.Conv2d):
        pass

    class ConvTranspose1d(_NoInit, nn.ConvTranspose1d):
        pass

    class ConvTranspose2d(_NoInit, nn.ConvTranspose2d):
        pass

    class Embedding(_NoInit, nn.Embedding):
        pass

    class LayerNorm(_NoInit, nn.LayerNorm):
        pass

    class GroupNorm(_NoInit, nn.GroupNorm):
        pass

    class RMSNorm(_NoInit, nn.RMSNorm):
        pass


@overload
def _like(tensor: Tensor, x: Tensor) -> Tensor: ...
@overload
def _like(tensor: Tensor | None, x: Tensor) -> Tensor | None: ...
def _like(tensor: Tensor | None, x: Tensor) -> Tensor | None:
    """``tensor`` in ``x``'s dtype and on its device; the same object when it already is."""
    if tensor is None or (tensor.dtype == x.dtype and tensor.device == x.device):
        return tensor
    return tensor.to(device=x.device, dtype=x.dtype)


def _conv_transpose(
    layer: nn.modules.conv._ConvTransposeNd,
    input: Tensor,
    output_size: list[int] | None,
    function: Callable[..., Tensor],
    spatial_dims: int,
) -> Tensor:
    """torch's ConvTranspose forward, with weight and bias cast like the input."""
    if layer.padding_mode != "zeros":
        raise ValueError(f"Only `zeros` padding mode is supported for {type(layer).__name__}")
    # torch annotates these list[int]; its own forward passes the layer's tuples, as here
    padding_of: Callable[..., list[int]] = layer._output_padding
    output_padding = padding_of(
        input,
        output_size,
        layer.stride,
        layer.padding,
        layer.kernel_size,
        spatial_dims,
        layer.dilation,
    )
    return function(
        input,
        _like(layer.weight, input),
        _like(layer.bias, input),
        layer.stride,
        layer.padding,
        output_padding,
        layer.groups,
        layer.dilation,
    )


class cast:
    """``ops.default`` layers that cast weight and bias to the input's dtype and device each call.

    The stored parameters are never modified; the cast copy lives for one forward. Embedding takes
    integer indices, so it follows the input's device only; pass ``out_dtype`` to get its rows in
    another dtype (only the gathered rows are converted, not the table).
    """

    __slots__ = ()

    class Linear(default.Linear):
        def forward(self, input: Tensor) -> Tensor:
            return F.linear(input, _like(self.weight, input), _like(self.bias, input))

    class Conv1d(default.Conv1d):
        def forward(self, input: Tensor) -> Tensor:
            return self._conv_forward(input, _like(self.weight, input), _like(self.bias, input))

    class Conv2d(default.Conv2d):
        def forward(self, input: Tensor) -> Tensor:
            return self._conv_forward(input, _like(self.weight, input), _like(self.bias, input))

    class ConvTranspose1d(default.ConvTranspose1d):
        def forward(self, input: Tensor, output_size: list[int] | None = None) -> Tensor:
            return _conv_transpose(self, input, output_size, F.conv_transpose1d, 1)

    class ConvTranspose2d(default.ConvTranspose2d):
        def forward(self, input: Tensor, output_size: list[int] | None = None) -> Tensor:
            return _conv_transpose(self, input, output_size, F.conv_transpose2d, 2)

    class Embedding(default.Embedding):
        def forward(self, input: Tensor, out_dtype: torch.dtype | None = None) -> Tensor:
            # max_norm renormalises the table in place; with a cast that is the cast copy.
            weight = self.weight
            if weight.device != input.device:
                weight = weight.to(input.device)
            out = F.embedding(
                input,
                weight,
                self.padding_idx,
                self.max_norm,
                self.norm_type,
                self.scale_grad_by_freq,
                self.sparse,
            )
            return out if out_dtype is None else out.to(out_dtype)

    class LayerNorm(default.LayerNorm):
        def forward(self, input: Tensor) -> Tensor:
            weight, bias = _like(self.weight, input), _like(self.bias, input)
            return F.layer_norm(input, self.normalized_shape, weight, bias, self.eps)

    class GroupNorm(default.GroupNorm):
        def forward(self, input: Tensor) -> Tensor:
            weight, bias = _like(self.weight, input), _like(self.bias, input)
            return F.group_norm(input, self.num_groups, weight, bias, self.eps)

    class RMSNorm(default.RMSNorm):
        def forward(self, input: Tensor) -> Tensor:
            return F.rms_norm(input, self.normalized_shape, _like(self.weight, input), self.eps)


_KAIMING = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
)
_AFFINE_NORMS = (
    nn.LayerNorm,
    nn.GroupNorm,
    nn.RMSNorm,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
)


def _fan_in(weight: Tensor) -> int:
    # What torch.nn.init computes: dim 1 times the receptive field (for ConvTranspose, dim 1 is
    # out_channels / groups, as in torch.nn).
    return weight.shape[1] * math.prod(weight.shape[2:]) if weight.dim() >= 2 else 0


def _init_kaiming(
    layer: nn.Module, weight: Tensor, bias: Tensor | None, generator: torch.Generator
) -> None:
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=generator)
    if bias is not None:
        fan_in = _fan_in(weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        nn.init.uniform_(bias, -bound, bound, generator=generator)


def _init_embedding(
    layer: nn.Module, weight: Tensor, bias: Tensor | None, generator: torch.Generator
) -> None:
    nn.init.normal_(weight, generator=generator)
    if isinstance(layer, nn.Embedding) and layer.padding_idx is not None:
        weight[layer.padding_idx].fill_(0)


def _init_norm(
    layer: nn.Module, weight: Tensor | None, bias: Tensor | None, generator: torch.Generator
) -> None:
    if weight is not None:
        nn.init.ones_(weight)
    if bias is not None:
        nn.init.zeros_(bias)
    reset_running_stats = getattr(layer, "reset_running_stats", None)
    if reset_running_stats is not None:
        reset_running_stats()


# (layer, weight, bias, generator); weight is Any: a Tensor, or None for a norm without affine
_Init = Callable[[nn.Module, Any, Tensor | None, torch.Generator], None]


def _initializer(layer: nn.Module) -> _Init | None:
    if isinstance(layer, _KAIMING):
        return _init_kaiming
    if isinstance(layer, nn.Embedding):
        return _init_embedding
    if isinstance(layer, _AFFINE_NORMS):
        return _init_norm
    return None


def _fillable(layer: nn.Module) -> bool:
    own = {name for name, _ in layer.named_parameters(recurse=False)}
    return not own or (_initializer(layer) is not None and own <= {"weight", "bias"})


def init_random(module: nn.Module, generator: torch.Generator) -> nn.Module:
    """Fill ``module``'s layers as ``torch.nn``'s ``reset_parameters`` would, from ``generator``.

    Meant for tests and for checking an architecture before its checkpoint exists. Draws come only
    from ``generator`` (never the global one), layer by layer in ``module.named_modules()`` order,
    each layer in ``torch.nn``'s own order (weight, then bias). A parameter shared by several layers
    is filled by the first; the later ones still draw for it and discard the draw, which is what
    building the layers with ``torch.nn`` and tying them afterwards gives. Buffers are left alone,
    except the running statistics of batch norms. A submodule that holds parameters of its own and
    is not one of the layers above raises ``TypeError`` naming it, rather than being left with
    uninitialised memory. Returns ``module``.
    """
    unsupported = [
        f"{name or '<root>'} ({type(layer).__name__})"
        for name, layer in module.named_modules()
        if not _fillable(layer)
    ]
    if unsupported:
        raise TypeError(
            "init_random knows Linear, Conv*, ConvTranspose*, Embedding and the affine norms; "
            f"these modules hold other parameters of their own: {', '.join(unsupported)}. "
            "Build them from those layers, or fill their parameters in the test after init_random."
        )
    for name, param in module.named_parameters():
        if param.device.type not in ("meta", generator.device.type):
            raise ValueError(
                f"init_random: {name} is on {param.device} but the generator is on "
                f"{generator.device}; pass torch.Generator(device={param.device.type!r})"
            )
    seen: set[int] = set()
    with torch.no_grad():
        for layer in module.modules():
            initialize = _initializer(layer)
            if initialize is None:
                continue
            # A parameter some earlier layer filled (a tied weight) is drawn into a scratch
            # tensor, so the generator advances exactly as torch.nn's constructors would.
            weight, bias = (_unseen(getattr(layer, n, None), seen) for n in ("weight", "bias"))
            initialize(layer, weight, bias, generator)
    return module


def _unseen(param: Tensor | None, seen: set[int]) -> Tensor | None:
    if param is None:
        return None
    if id(param) in seen:
        return torch.empty_like(param)
    seen.add(id(param))
    return param
