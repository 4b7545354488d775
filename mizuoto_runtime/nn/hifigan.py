"""HiFi-GAN as transformers' ``SpeechT5HifiGan``: a log-mel spectrogram in, a waveform out.

The generator of Kong et al., "HiFi-GAN: Generative Adversarial Networks for Efficient and High
Fidelity Speech Synthesis" (2020), in the form transformers ships for SpeechT5: an optional
normalisation by stored ``mean`` / ``scale``, a 7-tap input conv, one transposed conv per upsample
rate each followed by the average of the multi-receptive-field residual blocks, and a 7-tap output
conv with ``tanh``. Parameter names are upstream's, so a ``save_pretrained`` folder loads as it is;
the op order is upstream's too, so float32 on the CPU equals it bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.ops import default
from mizuoto_runtime.weights.loading import load_into
from mizuoto_sdk.errors import EngineUnavailable

__all__ = ["HifiGanConfig", "HifiGanVocoder", "build"]

_DEFAULTS: dict[str, Any] = {
    "model_in_dim": 80,
    "sampling_rate": 16000,
    "upsample_initial_channel": 512,
    "upsample_rates": [4, 4, 4, 4],
    "upsample_kernel_sizes": [8, 8, 8, 8],
    "resblock_kernel_sizes": [3, 7, 11],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "leaky_relu_slope": 0.1,
    "normalize_before": True,
}


@dataclass(frozen=True)
class HifiGanConfig:
    """The fields of a ``speecht5_hifigan`` config that shape the network or change its forward."""

    model_in_dim: int
    sampling_rate: int
    upsample_initial_channel: int
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    leaky_relu_slope: float
    normalize_before: bool

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> HifiGanConfig:
        """Upstream's defaults for absent fields; a value this port cannot honour is
        ``EngineUnavailable`` naming the field."""
        get = {**_DEFAULTS, **{k: v for k, v in config.items() if k in _DEFAULTS}}
        try:
            out = cls(
                model_in_dim=_positive(get, "model_in_dim"),
                sampling_rate=_positive(get, "sampling_rate"),
                upsample_initial_channel=_positive(get, "upsample_initial_channel"),
                upsample_rates=_ints(get, "upsample_rates"),
                upsample_kernel_sizes=_ints(get, "upsample_kernel_sizes"),
                resblock_kernel_sizes=_ints(get, "resblock_kernel_sizes"),
                resblock_dilation_sizes=tuple(
                    _ints({"resblock_dilation_sizes": d}, "resblock_dilation_sizes")
                    for d in _list(get, "resblock_dilation_sizes")
                ),
                leaky_relu_slope=_real(get, "leaky_relu_slope"),
                normalize_before=_bool(get, "normalize_before"),
            )
        except (TypeError, ValueError) as error:
            raise EngineUnavailable(f"speecht5_hifigan config: {error}") from error
        # Upstream zips these pairs, so a length mismatch silently drops layers and its forward
        # then fails indexing them; refuse it when loading instead.
        pairs = (
            ("upsample_rates", "upsample_kernel_sizes"),
            ("resblock_kernel_sizes", "resblock_dilation_sizes"),
        )
        for a, b in pairs:
            if len(getattr(out, a)) != len(getattr(out, b)) or not getattr(out, a):
                raise EngineUnavailable(
                    f"speecht5_hifigan config: {a} and {b} must be non-empty and of one length, "
                    f"got {len(getattr(out, a))} and {len(getattr(out, b))}"
                )
        if any(k < r for k, r in zip(out.upsample_kernel_sizes, out.upsample_rates, strict=True)):
            # Padding (k - rate) // 2 would be negative, which torch's conv refuses.
            raise EngineUnavailable(
                "speecht5_hifigan config: each of upsample_kernel_sizes must be at least its "
                f"upsample_rates entry, got {list(out.upsample_kernel_sizes)} for "
                f"{list(out.upsample_rates)}"
            )
        if any(k % 2 == 0 for k in out.resblock_kernel_sizes):
            # The residual add needs the block's length kept, which only odd kernels do
            # (upstream fails in its forward instead).
            raise EngineUnavailable(
                "speecht5_hifigan config: resblock_kernel_sizes must be odd, got "
                f"{list(out.resblock_kernel_sizes)}"
            )
        if out.upsample_initial_channel >> len(out.upsample_rates) < 1:
            raise EngineUnavailable(
                "speecht5_hifigan config: upsample_initial_channel "
                f"{out.upsample_initial_channel} halves to no channel in "
                f"{len(out.upsample_rates)} upsampling stages"
            )
        return out

    @property
    def hop_length(self) -> int:
        """Waveform samples per mel frame."""
        return math.prod(self.upsample_rates)


def _positive(config: Mapping[str, Any], name: str) -> int:
    value = config[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return value


def _ints(config: Mapping[str, Any], name: str) -> tuple[int, ...]:
    value = config[name]
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ValueError(f"{name}: expected a non-empty list of positive integers, got {value!r}")
    return tuple(_positive({name: v}, name) for v in value)


def _list(config: Mapping[str, Any], name: str) -> Sequence[Any]:
    value = config[name]
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError(f"{name}: expected a list, got {value!r}")
    return value


def _real(config: Mapping[str, Any], name: str) -> float:
    value = config[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a number, got {value!r}")
    return float(value)


def _bool(config: Mapping[str, Any], name: str) -> bool:
    value = config[name]
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected true or false, got {value!r}")
    return value


class HifiGanResidualBlock(nn.Module):
    """One multi-receptive-field block: per dilation, leaky ReLU, dilated conv, leaky ReLU, conv,
    plus the input. Paddings are upstream's ``(k * d - d) // 2`` (odd kernels keep the length)."""

    def __init__(
        self,
        channels: int,
        kernel_size: int,
        dilations: tuple[int, ...],
        slope: float,
        **factory: Any,
    ) -> None:
        super().__init__()
        self.slope = slope
        self.convs1 = nn.ModuleList(
            default.Conv1d(
                channels,
                channels,
                kernel_size,
                dilation=d,
                padding=(kernel_size * d - d) // 2,
                **factory,
            )
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            default.Conv1d(
                channels, channels, kernel_size, padding=(kernel_size - 1) // 2, **factory
            )
            for _ in dilations
        )

    def forward(self, x: Tensor) -> Tensor:
        for conv1, conv2 in zip(self.convs1, self.convs2, strict=True):
            y = conv1(F.leaky_relu(x, self.slope))
            x = conv2(F.leaky_relu(y, self.slope)) + x
        return x


class SpeechT5HifiGan(nn.Module):
    """The generator: mel ``[B, frames, num_mels]`` in, waveform ``[B, samples]`` out."""

    mean: Tensor
    scale: Tensor

    def __init__(self, config: HifiGanConfig, **factory: Any) -> None:
        super().__init__()
        self.config = config
        channels = config.upsample_initial_channel
        self.conv_pre = default.Conv1d(config.model_in_dim, channels, 7, padding=3, **factory)
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
        self.conv_post = default.Conv1d(last, 1, 7, padding=3, **factory)
        self.register_buffer("mean", torch.empty(config.model_in_dim, **factory))
        self.register_buffer("scale", torch.empty(config.model_in_dim, **factory))

    def execution_order(self) -> list[nn.Module]:
        """Each upsampler, then its stage's residual blocks: the order they run in."""
        kernels = len(self.config.resblock_kernel_sizes)
        order: list[nn.Module] = []
        for i, up in enumerate(self.upsampler):
            order.append(up)
            order.extend(self.resblocks[i * kernels : (i + 1) * kernels])
        return order

    def forward(self, mel: Tensor) -> Tensor:
        config = self.config
        if config.normalize_before:
            mel = (mel - self.mean) / self.scale
        x = self.conv_pre(mel.transpose(2, 1))  # [B, C, frames]
        kernels = len(config.resblock_kernel_sizes)
        for i, up in enumerate(self.upsampler):
            x = up(F.leaky_relu(x, config.leaky_relu_slope))  # [B, C / 2, frames * rate]
            blocks = self.resblocks[i * kernels : (i + 1) * kernels]
            total = blocks[0](x)
            for block in blocks[1:]:
                total += block(x)
            x = total / kernels
        # Upstream's last activation uses torch's default slope (0.01), not the config's.
        x = torch.tanh(self.conv_post(F.leaky_relu(x)))
        return x.squeeze(1)  # [B, samples]


class HifiGanVocoder:
    """A loaded HiFi-GAN: ``vocoder(mel)`` is ``SpeechT5HifiGan(config)(mel)``.

    ``mel`` is ``[B, frames, num_mels]`` (waveform ``[B, samples]``) or ``[frames, num_mels]``
    (waveform ``[samples]``); it is moved to the vocoder's device and dtype. Calls hold no state,
    so threads may share one vocoder. ``handles`` lets a memory manager place the weights.
    """

    def __init__(self, module: SpeechT5HifiGan, handles: tuple[ModelHandle, ...]) -> None:
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
        if not isinstance(mel, Tensor) or not mel.is_floating_point():
            raise ValueError(f"mel: expected a floating-point tensor, got {_what(mel)}")
        if mel.dim() not in (2, 3) or mel.shape[-1] != self.config.model_in_dim:
            raise ValueError(
                f"mel: expected [batch, frames, {self.config.model_in_dim}] or "
                f"[frames, {self.config.model_in_dim}], got {list(mel.shape)}"
            )
        if mel.shape[-2] < 1:
            raise ValueError("mel: expected at least one frame, got 0")
        batched = mel.dim() == 3
        mel = mel.to(device=self.device, dtype=self.dtype)
        with torch.inference_mode():
            wave = self.module(mel if batched else mel.unsqueeze(0))
        return wave if batched else wave[0]


def _what(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor"
    return f"a {type(value).__name__}"


def build(
    config: Mapping[str, Any],
    state_dict: Mapping[str, Tensor],
    *,
    device: str,
    dtype: torch.dtype,
    name: str = "speecht5_hifigan",
) -> HifiGanVocoder:
    """The vocoder of a ``speecht5_hifigan`` folder, its weights loaded strictly from
    ``state_dict`` (shared, not copied, when device and dtype already match); its handle is
    named ``NAME:vocoder``."""
    parsed = HifiGanConfig.from_dict(config)
    with torch.device("meta"):
        module = SpeechT5HifiGan(parsed, dtype=dtype)
    load_into(module, state_dict, cast=True)
    module.to(device).eval()
    handle = ModelHandle(
        module,
        name=f"{name}:vocoder",
        load_device=device,
        units=module.execution_order(),
    )
    return HifiGanVocoder(module, (handle,))
