"""VITS's waveform decoder: the HiFi-GAN generator as VITS uses it, latents in, audio out.

It differs from the runtime's ``SpeechT5HifiGan`` (``mizuoto_runtime.nn.hifigan``) in what goes
in and out: the input is the flow's latents ``[B, flow_size, frames]`` (no mean/scale
normalisation), a speaker embedding may be added after the first conv (``cond``), and the last
conv has no bias. Parameter names are transformers' ``VitsHifiGan``'s; float32 on the CPU equals
it bit for bit.

Speed: the activations after the first upsampler are the largest tensors of the whole model
(channels x samples), and upstream allocates a new one for every leaky ReLU and residual add.
Here an op whose input is a fresh tensor that nothing reads again runs in place: the same op on
the same values with the same strides, so the same bits. Before the first upsampler a one-frame
input has ambiguous strides (torch picks conv kernels by strides), so that activation stays out
of place, as upstream's.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_engine_vits.config import VitsConfig
from mizuoto_runtime.nn.hifigan import HifiGanResidualBlock
from mizuoto_runtime.ops import default


def _activate(fresh: Tensor, slope: float = 0.01) -> Tensor:
    """``F.leaky_relu(fresh, slope)``, in place unless the time axis has one step (then its strides
    are ambiguous, and out of place keeps upstream's)."""
    if fresh.shape[-1] > 1:
        return F.leaky_relu_(fresh, slope)
    return F.leaky_relu(fresh, slope)


def _residual_block(module: nn.Module, x: Tensor) -> Tensor:
    """``module(x)`` (a ``HifiGanResidualBlock``) with the second activation and the residual add
    in place (their inputs are conv outputs used once); ``x`` itself is left as it is."""
    block = cast("HifiGanResidualBlock", module)
    for conv1, conv2 in zip(block.convs1, block.convs2, strict=True):
        y = conv1(F.leaky_relu(x, block.slope))
        x = conv2(_activate(y, block.slope)).add_(x)
    return x


class VitsHifiGan(nn.Module):
    """Latents ``[B, flow_size, frames]`` -> waveform ``[B, 1, frames * hop_length]`` in [-1, 1]."""

    def __init__(self, config: VitsConfig, **factory: Any) -> None:
        super().__init__()
        self.slope = config.leaky_relu_slope
        self.num_kernels = len(config.resblock_kernel_sizes)
        channels = config.upsample_initial_channel
        self.conv_pre = default.Conv1d(config.flow_size, channels, 7, padding=3, **factory)
        self.upsampler = nn.ModuleList(
            default.ConvTranspose1d(
                channels >> i,
                channels >> (i + 1),
                k,
                stride=rate,
                padding=(k - rate) // 2,
                **factory,
            )
            for i, (rate, k) in enumerate(
                zip(config.upsample_rates, config.upsample_kernel_sizes, strict=True)
            )
        )
        self.resblocks = nn.ModuleList(
            HifiGanResidualBlock(channels >> (i + 1), k, d, config.leaky_relu_slope, **factory)
            for i in range(len(self.upsampler))
            for k, d in zip(
                config.resblock_kernel_sizes, config.resblock_dilation_sizes, strict=True
            )
        )
        last = channels >> len(self.upsampler)
        self.conv_post = default.Conv1d(last, 1, 7, padding=3, bias=False, **factory)
        if config.speaker_embedding_size != 0:
            self.cond = default.Conv1d(config.speaker_embedding_size, channels, 1, **factory)

    def execution_order(self) -> list[nn.Module]:
        """Each upsampler, then its stage's residual blocks: the order they run in."""
        order: list[nn.Module] = []
        k = self.num_kernels
        for i, up in enumerate(self.upsampler):
            order.append(up)
            order.extend(self.resblocks[i * k : (i + 1) * k])
        return order

    def forward(self, latents: Tensor, speaker: Tensor | None) -> Tensor:
        x = self.conv_pre(latents)
        if speaker is not None:
            x = x + self.cond(speaker)
        k = self.num_kernels
        for i, up in enumerate(self.upsampler):
            x = up(
                F.leaky_relu(x, self.slope) if i == 0 else _activate(x, self.slope)
            )  # [B, C / 2, frames * rate]
            blocks = self.resblocks[i * k : (i + 1) * k]
            total = _residual_block(blocks[0], x)
            for block in blocks[1:]:
                total += _residual_block(block, x)
            x = total.div_(k)
        # The last activation uses torch's default slope (0.01), as upstream's does.
        return torch.tanh_(self.conv_post(_activate(x)))
