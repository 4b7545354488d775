"""BigVGAN as NVIDIA's ``bigvgan.BigVGAN``: a mel spectrogram in, a waveform out.

The generator of Lee et al., "BigVGAN: A Universal Neural Vocoder with Large-Scale Training"
(2023), as NVIDIA/BigVGAN v2.4 ships it: a 7-tap input conv, one transposed conv per upsample
rate (no activation before it, unlike HiFi-GAN), each followed by the average of its
anti-aliased multi-periodicity blocks (AMPBlock1 or AMPBlock2), then an anti-aliased snake, a
7-tap output conv and ``tanh`` (or, in v2 configs with ``use_tanh_at_final: false``, a clamp to
[-1, 1]). Each periodic activation runs at twice the rate: upsampled by a transposed conv with a
12-tap Kaiser-windowed sinc, applied, and low-passed back down with the same kind of filter,
both edges replicate-padded. The filters are buffers of the checkpoint and are loaded as stored.

Parameter names are upstream's, so ``bigvgan_generator.pt`` (its ``"generator"`` entry) or a
``model.safetensors`` of the same state dict loads as it is. Weight-normed convolutions
(``weight_g`` / ``weight_v``) are folded once with ``torch._weight_norm``, the call upstream's
weight-norm hook makes before every forward; checkpoints saved after ``remove_weight_norm`` load
too. Upstream's op order is kept, so float32 on the CPU equals its torch path bit for bit (its
optional CUDA kernel for the activations is a different computation and is not what is matched).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.nn import _fields
from mizuoto_runtime.nn.dac import fold_weight_norm
from mizuoto_runtime.ops import default
from mizuoto_runtime.weights.loading import load_into
from mizuoto_sdk.errors import EngineUnavailable

__all__ = ["BigVGANConfig", "BigVGANVocoder", "build"]

# Upstream's Activation1d is always built with its defaults: ratio 2, 12-tap filters.
_RATIO = 2
_TAPS = 12


@dataclass(frozen=True)
class BigVGANConfig:
    """The hyperparameters of a BigVGAN ``config.json`` that shape the network or its forward."""

    num_mels: int
    resblock: str
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    upsample_initial_channel: int
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    activation: str
    snake_logscale: bool
    use_tanh_at_final: bool
    use_bias_at_final: bool
    sampling_rate: int | None

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> BigVGANConfig:
        """The fields upstream reads, with its defaults for the two v2 flags; a value it would
        not build is ``EngineUnavailable`` naming the field."""
        get = {"use_tanh_at_final": True, "use_bias_at_final": True, **config}
        try:
            dilations = get.get("resblock_dilation_sizes")
            if not isinstance(dilations, list | tuple):
                raise ValueError(f"resblock_dilation_sizes: expected a list, got {dilations!r}")
            out = cls(
                num_mels=_fields.positive(get, "num_mels"),
                resblock=_fields.choice(get, "resblock", ("1", "2")),
                upsample_rates=_fields.integers(get, "upsample_rates"),
                upsample_kernel_sizes=_fields.integers(get, "upsample_kernel_sizes"),
                upsample_initial_channel=_fields.positive(get, "upsample_initial_channel"),
                resblock_kernel_sizes=_fields.integers(get, "resblock_kernel_sizes"),
                resblock_dilation_sizes=tuple(
                    _fields.integers({"resblock_dilation_sizes": d}, "resblock_dilation_sizes")
                    for d in dilations
                ),
                activation=_fields.choice(get, "activation", ("snake", "snakebeta")),
                snake_logscale=_fields.boolean(get, "snake_logscale"),
                use_tanh_at_final=_fields.boolean(get, "use_tanh_at_final"),
                use_bias_at_final=_fields.boolean(get, "use_bias_at_final"),
                sampling_rate=_sampling_rate(get),
            )
        except ValueError as error:
            raise EngineUnavailable(f"bigvgan config: {error}") from error
        _check_shapes(out)
        return out

    @property
    def hop_length(self) -> int:
        """Waveform samples per mel frame."""
        return math.prod(self.upsample_rates)


def _sampling_rate(config: Mapping[str, Any]) -> int | None:
    """Informational (the generator never reads it): kept when it is a positive integer."""
    value = config.get("sampling_rate")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _check_shapes(config: BigVGANConfig) -> None:
    """Refuse, when loading, layouts whose forward upstream cannot run."""
    pairs = (
        ("upsample_rates", "upsample_kernel_sizes"),
        ("resblock_kernel_sizes", "resblock_dilation_sizes"),
    )
    for a, b in pairs:
        # Upstream zips these, then indexes by the first one's length: it fails in its forward.
        if len(getattr(config, a)) != len(getattr(config, b)):
            raise EngineUnavailable(
                f"bigvgan config: {a} and {b} must be of one length, got "
                f"{len(getattr(config, a))} and {len(getattr(config, b))}"
            )
    rates, kernels = config.upsample_rates, config.upsample_kernel_sizes
    if any(k < r for k, r in zip(kernels, rates, strict=True)):
        raise EngineUnavailable(
            "bigvgan config: each of upsample_kernel_sizes must be at least its upsample_rates "
            f"entry (padding (k - rate) // 2), got {list(kernels)} for {list(rates)}"
        )
    if any(k % 2 == 0 for k in config.resblock_kernel_sizes):
        raise EngineUnavailable(
            "bigvgan config: resblock_kernel_sizes must be odd (the residual add needs the "
            f"length kept), got {list(config.resblock_kernel_sizes)}"
        )
    if config.upsample_initial_channel >> len(rates) < 1:
        raise EngineUnavailable(
            f"bigvgan config: upsample_initial_channel {config.upsample_initial_channel} halves "
            f"to no channel in {len(rates)} upsampling stages"
        )


class Snake(nn.Module):
    """Upstream's ``Snake``, ``x + 1 / (alpha + 1e-9) * sin(alpha x)^2`` per channel, or with
    ``beta`` its ``SnakeBeta``, which divides by a second parameter ``beta`` instead; both stored
    as logarithms when ``snake_logscale``."""

    def __init__(self, channels: int, logscale: bool, beta: bool, **factory: Any) -> None:
        super().__init__()
        self.logscale = logscale
        self.alpha = nn.Parameter(torch.empty(channels, **factory))
        self.beta = nn.Parameter(torch.empty(channels, **factory)) if beta else None

    def forward(self, x: Tensor) -> Tensor:
        alpha = self.alpha.unsqueeze(0).unsqueeze(-1)  # [1, C, 1]
        beta = None if self.beta is None else self.beta.unsqueeze(0).unsqueeze(-1)
        if self.logscale:
            alpha = torch.exp(alpha)
            beta = None if beta is None else torch.exp(beta)
        divisor = alpha if beta is None else beta
        return x + (1.0 / (divisor + 1e-9)) * torch.pow(torch.sin(x * alpha), 2)


class UpSample1d(nn.Module):
    """Twice the rate: replicate-pad 5, transposed conv with the stored filter, times 2, trim."""

    filter: Tensor

    def __init__(self, **factory: Any) -> None:
        super().__init__()
        self.pad = _TAPS // _RATIO - 1
        self.pad_left = self.pad * _RATIO + (_TAPS - _RATIO) // 2
        self.pad_right = self.pad * _RATIO + (_TAPS - _RATIO + 1) // 2
        self.register_buffer("filter", torch.empty(1, 1, _TAPS, **factory))

    def forward(self, x: Tensor) -> Tensor:
        channels = x.shape[1]
        x = F.pad(x, (self.pad, self.pad), mode="replicate")
        weight = self.filter.expand(channels, -1, -1)
        x = _RATIO * F.conv_transpose1d(x, weight, stride=_RATIO, groups=channels)
        return x[..., self.pad_left : -self.pad_right]


class LowPassFilter1d(nn.Module):
    """Half the rate: replicate-pad (5, 6) for the even filter, strided depthwise conv."""

    filter: Tensor

    def __init__(self, **factory: Any) -> None:
        super().__init__()
        self.register_buffer("filter", torch.empty(1, 1, _TAPS, **factory))

    def forward(self, x: Tensor) -> Tensor:
        channels = x.shape[1]
        x = F.pad(x, (_TAPS // 2 - 1, _TAPS // 2), mode="replicate")
        return F.conv1d(x, self.filter.expand(channels, -1, -1), stride=_RATIO, groups=channels)


class DownSample1d(nn.Module):
    """Upstream's wrapper around the low-pass filter (kept for its parameter names)."""

    def __init__(self, **factory: Any) -> None:
        super().__init__()
        self.lowpass = LowPassFilter1d(**factory)

    def forward(self, x: Tensor) -> Tensor:
        return self.lowpass(x)


class Activation1d(nn.Module):
    """The anti-aliased activation: upsample, snake, downsample."""

    def __init__(self, act: Snake, **factory: Any) -> None:
        super().__init__()
        self.act = act
        self.upsample = UpSample1d(**factory)
        self.downsample = DownSample1d(**factory)

    def forward(self, x: Tensor) -> Tensor:
        return self.downsample(self.act(self.upsample(x)))


def _conv(channels: int, kernel: int, dilation: int, **factory: Any) -> nn.Conv1d:
    padding = int((kernel * dilation - dilation) / 2)  # upstream's get_padding
    return default.Conv1d(channels, channels, kernel, dilation=dilation, padding=padding, **factory)


class AMPBlock(nn.Module):
    """AMPBlock1 (each dilated conv of ``convs1`` followed by an undilated one of ``convs2``, an
    anti-aliased snake before each conv) or AMPBlock2 (``convs`` only, one snake before each);
    every pair, or every single conv, adds its input back."""

    def __init__(
        self,
        config: BigVGANConfig,
        channels: int,
        kernel: int,
        dilations: tuple[int, ...],
        **factory: Any,
    ) -> None:
        super().__init__()
        self.two_convs = config.resblock == "1"
        first = nn.ModuleList(_conv(channels, kernel, d, **factory) for d in dilations)
        if self.two_convs:
            self.convs1 = first
            self.convs2 = nn.ModuleList(_conv(channels, kernel, 1, **factory) for _ in dilations)
        else:
            self.convs = first
        count = len(dilations) * (2 if self.two_convs else 1)
        self.activations = nn.ModuleList(
            Activation1d(_snake(config, channels, **factory), **factory) for _ in range(count)
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.two_convs:
            acts = self.activations
            for c1, c2, a1, a2 in zip(self.convs1, self.convs2, acts[::2], acts[1::2], strict=True):
                x = c2(a2(c1(a1(x)))) + x
        else:
            for conv, act in zip(self.convs, self.activations, strict=True):
                x = conv(act(x)) + x
        return x


def _snake(config: BigVGANConfig, channels: int, **factory: Any) -> Snake:
    return Snake(channels, config.snake_logscale, config.activation == "snakebeta", **factory)


class BigVGAN(nn.Module):
    """The generator: mel ``[B, num_mels, frames]`` in, waveform ``[B, 1, samples]`` out."""

    def __init__(self, config: BigVGANConfig, **factory: Any) -> None:
        super().__init__()
        self.config = config
        width = config.upsample_initial_channel
        self.conv_pre = default.Conv1d(config.num_mels, width, 7, 1, padding=3, **factory)
        self.ups = nn.ModuleList(
            nn.ModuleList(
                [
                    default.ConvTranspose1d(
                        width >> i, width >> (i + 1), k, rate, padding=(k - rate) // 2, **factory
                    )
                ]
            )
            for i, (rate, k) in enumerate(
                zip(config.upsample_rates, config.upsample_kernel_sizes, strict=True)
            )
        )
        self.resblocks = nn.ModuleList(
            AMPBlock(config, width >> (i + 1), k, d, **factory)
            for i in range(len(self.ups))
            for k, d in zip(
                config.resblock_kernel_sizes, config.resblock_dilation_sizes, strict=True
            )
        )
        last = width >> len(self.ups)
        self.activation_post = Activation1d(_snake(config, last, **factory), **factory)
        self.conv_post = default.Conv1d(
            last, 1, 7, 1, padding=3, bias=config.use_bias_at_final, **factory
        )

    def execution_order(self) -> list[nn.Module]:
        """Each upsampling conv, then its stage's AMP blocks: the order they run in."""
        kernels = len(self.config.resblock_kernel_sizes)
        order: list[nn.Module] = []
        for i, up in enumerate(self.ups):
            order.extend(up.children())
            order.extend(self.resblocks[i * kernels : (i + 1) * kernels])
        return order

    def forward(self, mel: Tensor) -> Tensor:
        x = self.conv_pre(mel)  # [B, C, frames]
        kernels = len(self.config.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            for layer in up.children():
                x = layer(x)  # [B, C / 2, frames * rate]
            blocks = self.resblocks[i * kernels : (i + 1) * kernels]
            total = blocks[0](x)
            for block in blocks[1:]:
                total += block(x)  # in place, as upstream
            x = total / kernels
        x = self.conv_post(self.activation_post(x))
        if self.config.use_tanh_at_final:
            return torch.tanh(x)
        return torch.clamp(x, min=-1.0, max=1.0)


class BigVGANVocoder:
    """A loaded BigVGAN: ``vocoder(mel)`` is ``BigVGAN(h)(mel)[:, 0]``.

    ``mel`` is ``[B, num_mels, frames]`` (waveform ``[B, samples]``) or ``[num_mels, frames]``
    (waveform ``[samples]``), channels first as upstream's ``get_mel_spectrogram`` makes it; it is
    moved to the vocoder's device and dtype. Calls hold no state, so threads may share one
    vocoder. ``handles`` lets a memory manager place the weights.
    """

    def __init__(self, module: BigVGAN, handles: tuple[ModelHandle, ...]) -> None:
        self.module = module
        self.config = module.config
        self.handles = handles
        self.sample_rate = module.config.sampling_rate
        self.hop_length = module.config.hop_length

    @property
    def device(self) -> torch.device:
        return self.module.conv_pre.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.module.conv_pre.weight.dtype

    def __call__(self, mel: Tensor) -> Tensor:
        mels = self.config.num_mels
        if not isinstance(mel, Tensor) or not mel.is_floating_point():
            raise ValueError(f"mel: expected a floating-point tensor, got {_fields.what(mel)}")
        if mel.dim() not in (2, 3) or mel.shape[-2] != mels:
            raise ValueError(
                f"mel: expected [batch, {mels}, frames] or [{mels}, frames], got {list(mel.shape)}"
            )
        if mel.shape[-1] < 1:
            raise ValueError("mel: expected at least one frame, got 0")
        batched = mel.dim() == 3
        mel = mel.to(device=self.device, dtype=self.dtype)
        with torch.inference_mode():
            wave = self.module(mel if batched else mel.unsqueeze(0))[:, 0]
        return wave if batched else wave[0]


def build(
    config: Mapping[str, Any],
    state_dict: Mapping[str, Tensor],
    *,
    device: str,
    dtype: torch.dtype,
    name: str = "bigvgan",
) -> BigVGANVocoder:
    """The vocoder of a BigVGAN folder, its weights loaded strictly from ``state_dict`` (weight
    norm folded in ``dtype``); its handle is named ``NAME:vocoder``."""
    parsed = BigVGANConfig.from_dict(config)
    with torch.device("meta"):
        module = BigVGAN(parsed, dtype=dtype)
    load_into(module, fold_weight_norm(state_dict, dtype), cast=True)
    module.to(device).eval()
    handle = ModelHandle(
        module, name=f"{name}:vocoder", load_device=device, units=module.execution_order()
    )
    return BigVGANVocoder(module, (handle,))
