"""SEANet convolution blocks as EnCodec and Mimi use them (transformers' ``EncodecConv1d``,
``EncodecConvTranspose1d``, ``EncodecLSTM``, ``EncodecResnetBlock`` and their Mimi twins).

Parameter names are upstream's (``conv.weight``, ``norm.weight``, ``lstm.weight_ih_l0``,
``block.1.conv.bias``), so a checkpoint loads unchanged once its weight-norm pairs are folded by
``fold_weight_norm_like_torch``. Every block has a whole-signal ``forward`` that pads exactly as
upstream does (so the float32 output is bit for bit upstream's) and a ``step(x, state)`` that
carries what the next chunk needs in ``state`` (a dict owned by one stream), for causal decoders.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_runtime.ops import default

__all__ = [
    "LSTM",
    "ConvTranspose1d",
    "NormConv1d",
    "ResnetBlock",
    "StreamState",
    "fold_weight_norm_like_torch",
]

StreamState = dict[int, Any]
"""A stream's carried tensors, keyed by the ``id`` of the block that owns them."""

_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def fold_weight_norm_like_torch(
    state_dict: Mapping[str, Tensor], dtype: torch.dtype
) -> dict[str, Tensor]:
    """Fold ``parametrizations.weight.original0/1`` (and ``weight_g/_v``) into ``weight``.

    torch's weight-norm parametrization computes ``torch._weight_norm(v, g, 0)`` at every forward,
    in the module's dtype; folding once with that same call, on the pair cast to ``dtype``, gives
    the very bits upstream convolves with. Every other tensor is cast to ``dtype`` if floating.
    """
    out: dict[str, Tensor] = {}
    pairs = (
        ("parametrizations.weight.original0", "parametrizations.weight.original1"),
        ("weight_g", "weight_v"),
    )
    for key, value in state_dict.items():
        for g_name, v_name in pairs:
            if key.endswith(g_name) or key.endswith(v_name):
                base = key[: -len(g_name)] if key.endswith(g_name) else key[: -len(v_name)]
                if base + "weight" not in out:
                    g = state_dict[base + g_name].to(dtype)
                    v = state_dict[base + v_name].to(dtype)
                    out[base + "weight"] = torch._weight_norm(v, g, 0)
                break
        else:
            out[key] = value.to(dtype) if value.is_floating_point() else value
    return out


def _extra_padding(length: int, kernel: int, stride: int, total: int) -> int:
    """Right padding that completes the last window, computed in float32 as upstream does."""
    frames = torch.tensor(float(length - kernel + total), dtype=torch.float32)
    frames = torch.ceil(frames / torch.tensor(float(stride), dtype=torch.float32) + 1)
    ideal = (int(frames.item()) - 1) * stride + kernel - total
    return ideal - length


def _pad(x: Tensor, left: int, right: int, mode: str) -> Tensor:
    """``F.pad``, with reflect padding of a signal shorter than the pad made possible by zeros
    added on the right first (and cut again), as upstream's ``_pad1d``."""
    if mode != "reflect":
        return F.pad(x, (left, right), mode)
    extra = max(0, max(left, right) - x.shape[-1] + 1)
    if extra:
        x = F.pad(x, (0, extra))
    padded = F.pad(x, (left, right), mode)
    return padded[..., : padded.shape[-1] - extra]


class NormConv1d(nn.Module):
    """A padded Conv1d, optionally followed by a one-group GroupNorm ("time_group_norm")."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        causal: bool,
        pad_mode: str,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
        group_norm: bool = False,
    ) -> None:
        super().__init__()
        if pad_mode not in _PAD_MODES:
            raise ValueError(f"pad_mode: expected one of {_PAD_MODES}, got {pad_mode!r}")
        self.conv = default.Conv1d(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            dilation=dilation,
            groups=groups,
            bias=bias,
        )
        self.norm = default.GroupNorm(1, out_channels) if group_norm else None
        self.causal = causal
        self.pad_mode = pad_mode
        self.stride = stride
        self.effective_kernel = (kernel_size - 1) * dilation + 1
        self.padding_total = self.effective_kernel - stride

    def forward(self, x: Tensor) -> Tensor:
        total = self.padding_total
        extra = _extra_padding(x.shape[-1], self.effective_kernel, self.stride, total)
        if self.causal:
            x = _pad(x, total, extra, self.pad_mode)
        else:
            right = total // 2
            x = _pad(x, total - right, right + extra, self.pad_mode)
        x = self.conv(x)
        return x if self.norm is None else self.norm(x)

    def step(self, x: Tensor, state: StreamState) -> Tensor:
        """The causal output for ``x``, the chunk after the ones already stepped.

        The first chunk is padded as the whole signal would be (it must hold ``padding_total + 1``
        samples, which the caller ensures); later chunks are preceded by the last
        ``padding_total`` samples seen. Only stride 1 keeps the output aligned with the input.
        """
        total = self.padding_total
        past = state.get(id(self))
        x = _pad(x, total, 0, self.pad_mode) if past is None else torch.cat([past, x], dim=-1)
        state[id(self)] = x[..., x.shape[-1] - total :]
        return self.conv(x)


class ConvTranspose1d(nn.Module):
    """A ConvTranspose1d whose ``kernel - stride`` overhang is trimmed as upstream trims it."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int,
        *,
        causal: bool,
        trim_right_ratio: float = 1.0,
        groups: int = 1,
        bias: bool = True,
        group_norm: bool = False,
    ) -> None:
        super().__init__()
        self.conv = default.ConvTranspose1d(
            in_channels, out_channels, kernel_size, stride, groups=groups, bias=bias
        )
        self.norm = default.GroupNorm(1, out_channels) if group_norm else None
        self.stride = stride
        total = kernel_size - stride
        self.padding_total = total
        self.padding_right = math.ceil(total * trim_right_ratio) if causal else total // 2
        self.padding_left = total - self.padding_right

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv(x)
        if self.norm is not None:
            x = self.norm(x)
        return x[..., self.padding_left : x.shape[-1] - self.padding_right]

    def step(self, x: Tensor, state: StreamState) -> Tensor:
        """``stride`` samples per input frame; the overhang waits for the next chunk.

        The overhang is summed without the bias, which is added once per emitted sample.
        """
        full = F.conv_transpose1d(x, self.conv.weight, None, self.stride, groups=self.conv.groups)
        tail = state.get(id(self))
        if tail is not None:
            full[..., : tail.shape[-1]] += tail
        emitted = x.shape[-1] * self.stride
        state[id(self)] = full[..., emitted:]
        out = full[..., :emitted]
        bias = self.conv.bias
        return out if bias is None else out + bias[:, None]


class LSTM(nn.Module):
    """Upstream's ``EncodecLSTM``: a time-major LSTM over conv-layout input, plus its input."""

    def __init__(self, dimension: int, num_layers: int) -> None:
        super().__init__()
        self.lstm = _LSTM(dimension, dimension, num_layers)

    def forward(self, x: Tensor) -> Tensor:
        x = x.permute(2, 0, 1)  # [T, B, C]
        return (self.lstm(x)[0] + x).permute(1, 2, 0)

    def step(self, x: Tensor, state: StreamState) -> Tensor:
        x = x.permute(2, 0, 1)
        out, carried = self.lstm(x, state.get(id(self)))
        state[id(self)] = carried
        return (out + x).permute(1, 2, 0)


class _LSTM(nn.LSTM):
    """``torch.nn.LSTM`` whose construction draws nothing (weights come from the checkpoint)."""

    def reset_parameters(self) -> None:
        """Left empty on purpose, as ``ops.default`` layers do."""


class ResnetBlock(nn.Module):
    """SEANet residual block: ELU, conv, ELU, conv on one branch, a 1x1 conv (or nothing) on
    the other; upstream's ``block`` list keeps the ELUs so the conv indices match its keys."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        kernel_size: int,
        dilation: int,
        *,
        causal: bool,
        pad_mode: str,
        conv_shortcut: bool,
        group_norm: bool = False,
    ) -> None:
        super().__init__()
        convs = (
            NormConv1d(
                dim,
                hidden,
                kernel_size,
                dilation=dilation,
                causal=causal,
                pad_mode=pad_mode,
                group_norm=group_norm,
            ),
            NormConv1d(hidden, dim, 1, causal=causal, pad_mode=pad_mode, group_norm=group_norm),
        )
        self.block = nn.ModuleList([nn.ELU(), convs[0], nn.ELU(), convs[1]])
        self.shortcut: nn.Module = (
            NormConv1d(dim, dim, 1, causal=causal, pad_mode=pad_mode, group_norm=group_norm)
            if conv_shortcut
            else nn.Identity()
        )

    def forward(self, x: Tensor) -> Tensor:
        residual = x
        for layer in self.block:
            x = layer(x)
        return self.shortcut(residual) + x

    def step(self, x: Tensor, state: StreamState) -> Tensor:
        residual = x
        for layer in self.block:
            x = layer.step(x, state) if isinstance(layer, NormConv1d) else layer(x)
        shortcut = self.shortcut
        skip = shortcut.step(residual, state) if isinstance(shortcut, NormConv1d) else residual
        return skip + x


def step_layers(layers: nn.ModuleList, x: Tensor, state: StreamState) -> Tensor:
    """Run ``layers`` on the next chunk, each block carrying its own part of ``state``."""
    for layer in layers:
        stepped = getattr(layer, "step", None)
        x = layer(x) if stepped is None else stepped(x, state)
    return x


def warmup_frames(layers: nn.ModuleList) -> int:
    """Frames a stream holds back before its first chunk, so that every padded conv first sees
    ``padding_total + 1`` samples and pads them as the whole signal would be padded."""
    need, rate = 1, 1  # rate: samples per input frame at the current layer
    for module in layers.modules():
        if isinstance(module, NormConv1d) and module.pad_mode != "constant":
            need = max(need, -(-(module.padding_total + 1) // rate))
        elif isinstance(module, ConvTranspose1d):
            rate *= module.stride
    return need
