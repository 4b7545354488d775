"""How long each text id lasts: VITS's stochastic duration predictor (inverse only) or the plain
one.

The stochastic predictor (Kim et al. 2021, §2.2.2) turns Gaussian noise into log-durations
through neural spline flows (Durkan et al., "Neural Spline Flows", 2019: monotonic
rational-quadratic splines, identity outside ``[-tail_bound, tail_bound]``) conditioned on the
text. Only the inverse direction runs at inference; the posterior flows and convolutions
(``post_*``) serve training and are not built. Parameter names are transformers'
``VitsStochasticDurationPredictor`` / ``VitsDurationPredictor``; the noise is drawn from the
generator the caller passes, in upstream's shape ``[B, 2, T]``, in float32 on the CPU.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_engine_vits.config import VitsConfig
from mizuoto_runtime.ops import default

_MIN_BIN_WIDTH = 1e-3
_MIN_BIN_HEIGHT = 1e-3
_MIN_DERIVATIVE = 1e-3


def inverse_spline(
    x: Tensor, widths: Tensor, heights: Tensor, derivatives: Tensor, tail_bound: float
) -> Tensor:
    """The inverse of the rational-quadratic spline inside the tails, the identity outside.

    ``widths`` and ``heights`` hold ``bins`` unnormalised logits per element of ``x``,
    ``derivatives`` ``bins - 1``; the boundary derivatives are fixed so the spline meets the
    identity with slope one. Upstream's expressions in upstream's order (its python-float
    constants too), so the float32 result is its bits.
    """
    inside = (x >= -tail_bound) & (x <= tail_bound)
    out = torch.zeros_like(x)
    derivatives = F.pad(derivatives, pad=(1, 1))
    boundary = np.log(np.exp(1 - _MIN_DERIVATIVE) - 1)
    derivatives[..., 0] = boundary
    derivatives[..., -1] = boundary
    out[~inside] = x[~inside]
    out[inside] = _inverse_inside(
        x[inside], widths[inside, :], heights[inside, :], derivatives[inside, :], tail_bound
    )
    return out


def _knots(logits: Tensor, least: float, lower: float, upper: float) -> tuple[Tensor, Tensor]:
    """Bin sizes (each at least ``least`` of the range) and their cumulative knots."""
    bins = logits.shape[-1]
    sizes = least + (1 - least * bins) * F.softmax(logits, dim=-1)
    knots = F.pad(torch.cumsum(sizes, dim=-1), pad=(1, 0), mode="constant", value=0.0)
    knots = (upper - lower) * knots + lower
    knots[..., 0] = lower
    knots[..., -1] = upper
    return knots[..., 1:] - knots[..., :-1], knots


def _inverse_inside(
    y: Tensor, widths: Tensor, heights: Tensor, derivatives: Tensor, tail_bound: float
) -> Tensor:
    lower, upper = -tail_bound, tail_bound
    widths, cumwidths = _knots(widths, _MIN_BIN_WIDTH, lower, upper)
    slopes = _MIN_DERIVATIVE + F.softplus(derivatives)
    heights, cumheights = _knots(heights, _MIN_BIN_HEIGHT, lower, upper)
    cumheights[..., -1] += 1e-6  # upstream nudges the last knot in place (it is searched below)
    index = (torch.sum(y[..., None] >= cumheights, dim=-1) - 1)[..., None]

    def at(t: Tensor) -> Tensor:
        return t.gather(-1, index)[..., 0]

    x0, width, y0 = at(cumwidths), at(widths), at(cumheights)
    delta = heights / widths
    bin_delta, d0, d1, height = at(delta), at(slopes), at(slopes[..., 1:]), at(heights)
    # Solve the bin's rational quadratic for its position theta: a theta^2 + b theta + c = 0.
    curvature = d0 + d1 - 2 * bin_delta
    rise = y - y0
    term = rise * curvature
    a = height * (bin_delta - d0) + term
    b = height * d0 - term
    c = -bin_delta * rise
    discriminant = b.pow(2) - 4 * a * c
    theta = (2 * c) / (-b - torch.sqrt(discriminant))
    return theta * width + x0


class VitsDilatedDepthSeparableConv(nn.Module):
    """Depthwise dilated convolutions (dilation ``kernel ** i``), each with a pointwise one, layer
    norms and GELUs, residual around each layer."""

    def __init__(self, config: VitsConfig, **factory: Any) -> None:
        super().__init__()
        k, channels = config.duration_predictor_kernel_size, config.hidden_size
        self.convs_dilated = nn.ModuleList()
        self.convs_pointwise = nn.ModuleList()
        self.norms_1 = nn.ModuleList()
        self.norms_2 = nn.ModuleList()
        for i in range(config.depth_separable_num_layers):
            dilation = k**i
            self.convs_dilated.append(
                default.Conv1d(
                    channels,
                    channels,
                    k,
                    groups=channels,
                    dilation=dilation,
                    padding=(k * dilation - dilation) // 2,
                    **factory,
                )
            )
            self.convs_pointwise.append(default.Conv1d(channels, channels, 1, **factory))
            self.norms_1.append(default.LayerNorm(channels, **factory))  # eps 1e-5, as upstream
            self.norms_2.append(default.LayerNorm(channels, **factory))

    def forward(self, x: Tensor, mask: Tensor, cond: Tensor | None = None) -> Tensor:
        if cond is not None:
            x = x + cond
        layers = zip(
            self.convs_dilated, self.norms_1, self.convs_pointwise, self.norms_2, strict=True
        )
        for dilated, norm_1, pointwise, norm_2 in layers:
            h = norm_1(dilated(x * mask).transpose(1, -1)).transpose(1, -1)
            h = norm_2(pointwise(F.gelu(h)).transpose(1, -1)).transpose(1, -1)
            x = x + F.gelu(h)
        return x * mask


class VitsConvFlow(nn.Module):
    """A spline coupling: the second channel transformed by a spline the first one parameterises."""

    def __init__(self, config: VitsConfig, **factory: Any) -> None:
        super().__init__()
        self.filter_channels = filters = config.hidden_size
        self.half_channels = half = config.depth_separable_channels // 2
        self.num_bins = bins = config.duration_predictor_flow_bins
        self.tail_bound = config.duration_predictor_tail_bound
        self.conv_pre = default.Conv1d(half, filters, 1, **factory)
        self.conv_dds = VitsDilatedDepthSeparableConv(config, **factory)
        self.conv_proj = default.Conv1d(filters, half * (bins * 3 - 1), 1, **factory)

    def forward(self, x: Tensor, mask: Tensor, cond: Tensor) -> Tensor:
        """The inverse (the direction inference runs)."""
        first, second = torch.split(x, [self.half_channels] * 2, dim=1)
        h = self.conv_dds(self.conv_pre(first), mask, cond)
        h = self.conv_proj(h) * mask
        batch, channels, length = first.shape
        h = h.reshape(batch, channels, -1, length).permute(0, 1, 3, 2)  # [B, C, T, 3 bins - 1]
        bins, scale = self.num_bins, math.sqrt(self.filter_channels)
        widths, heights = h[..., :bins] / scale, h[..., bins : 2 * bins] / scale
        second = inverse_spline(second, widths, heights, h[..., 2 * bins :], self.tail_bound)
        return torch.cat([first, second], dim=1) * mask


class VitsElementwiseAffine(nn.Module):
    """A learned per-channel affine map (its inverse at inference)."""

    def __init__(self, config: VitsConfig, **factory: Any) -> None:
        super().__init__()
        channels = config.depth_separable_channels
        self.translate = nn.Parameter(torch.empty(channels, 1, **factory))
        self.log_scale = nn.Parameter(torch.empty(channels, 1, **factory))

    def forward(self, x: Tensor, mask: Tensor, cond: Tensor) -> Tensor:
        """The inverse (the direction inference runs)."""
        return (x - self.translate) * torch.exp(-self.log_scale) * mask


class VitsStochasticDurationPredictor(nn.Module):
    """Noise ``[B, 2, T]`` -> log-durations ``[B, 1, T]`` through the inverted duration flows."""

    def __init__(self, config: VitsConfig, **factory: Any) -> None:
        super().__init__()
        filters = config.hidden_size
        self.conv_pre = default.Conv1d(filters, filters, 1, **factory)
        self.conv_proj = default.Conv1d(filters, filters, 1, **factory)
        self.conv_dds = VitsDilatedDepthSeparableConv(config, **factory)
        if config.speaker_embedding_size != 0:
            self.cond = default.Conv1d(config.speaker_embedding_size, filters, 1, **factory)
        flows: list[nn.Module] = [VitsElementwiseAffine(config, **factory)]
        flows += [
            VitsConvFlow(config, **factory) for _ in range(config.duration_predictor_num_flows)
        ]
        self.flows = nn.ModuleList(flows)

    def forward(
        self,
        x: Tensor,
        mask: Tensor,
        speaker: Tensor | None,
        *,
        noise_scale: float,
        generator: torch.Generator,
    ) -> Tensor:
        x = self.conv_pre(x)
        if speaker is not None:
            x = x + self.cond(speaker)
        x = self.conv_proj(self.conv_dds(x, mask)) * mask
        # Upstream draws on the CPU in float32, then moves the noise: the same bits on any device.
        noise = torch.randn(x.size(0), 2, x.size(2), generator=generator)
        latents = noise.to(device=x.device, dtype=x.dtype) * noise_scale
        # The inverse runs the flows last to first and skips the first spline flow (upstream
        # calls it "a useless vflow"): [flow_n, ..., flow_2, affine].
        inverse = list(reversed(self.flows))
        for flow in [*inverse[:-2], inverse[-1]]:
            latents = flow(torch.flip(latents, [1]), mask, x)
        return latents[:, :1, :]


class VitsDurationPredictor(nn.Module):
    """Two convolutions with ReLU and layer norm, then a projection: the log-duration per id."""

    def __init__(self, config: VitsConfig, **factory: Any) -> None:
        super().__init__()
        k, filters = (
            config.duration_predictor_kernel_size,
            config.duration_predictor_filter_channels,
        )
        eps = config.layer_norm_eps
        self.conv_1 = default.Conv1d(config.hidden_size, filters, k, padding=k // 2, **factory)
        self.norm_1 = default.LayerNorm(filters, eps=eps, **factory)
        self.conv_2 = default.Conv1d(filters, filters, k, padding=k // 2, **factory)
        self.norm_2 = default.LayerNorm(filters, eps=eps, **factory)
        self.proj = default.Conv1d(filters, 1, 1, **factory)
        if config.speaker_embedding_size != 0:
            size = config.speaker_embedding_size
            self.cond = default.Conv1d(size, config.hidden_size, 1, **factory)

    def forward(self, x: Tensor, mask: Tensor, speaker: Tensor | None) -> Tensor:
        if speaker is not None:
            x = x + self.cond(speaker)
        x = torch.relu(self.conv_1(x * mask))
        x = self.norm_1(x.transpose(1, -1)).transpose(1, -1)
        x = torch.relu(self.conv_2(x * mask))
        x = self.norm_2(x.transpose(1, -1)).transpose(1, -1)
        return self.proj(x * mask) * mask
