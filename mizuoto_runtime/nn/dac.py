"""DAC as transformers' ``DacModel``: audio to residual-VQ codes and codes back to audio.

The Descript Audio Codec of Kumar et al., "High-Fidelity Audio Compression with Improved RVQGAN"
(2023): a convolutional encoder and decoder with snake activations, and a residual vector quantizer
whose codebooks are searched in a low-dimensional, l2-normalised space. Parameter names are
upstream's, so a ``save_pretrained`` folder loads as it is; weight-normed convolutions
(``weight_g`` / ``weight_v`` or ``parametrizations.weight.original0`` / ``original1``) are folded
with the same ``torch._weight_norm`` call torch's parametrization makes at forward time. The op
order is upstream's, so float32 on the CPU equals it bit for bit. DAC is not causal: there is no
streaming decoder, a whole code sequence decodes at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.ops import default
from mizuoto_runtime.weights.loading import load_into
from mizuoto_sdk.errors import EngineUnavailable

__all__ = ["DacCodec", "DacConfig", "build"]

_DEFAULTS: dict[str, Any] = {
    "encoder_hidden_size": 64,
    "downsampling_ratios": [2, 4, 8, 8],
    "decoder_hidden_size": 1536,
    "n_codebooks": 9,
    "codebook_size": 1024,
    "codebook_dim": 8,
    "sampling_rate": 16000,
}


@dataclass(frozen=True)
class DacConfig:
    """The fields of a ``dac`` config that shape the network. ``hidden_size`` and
    ``upsampling_ratios`` are upstream's derived values unless the config stores others, which
    upstream then uses too; the loss weights and quantizer dropout only matter in training."""

    encoder_hidden_size: int
    downsampling_ratios: tuple[int, ...]
    decoder_hidden_size: int
    n_codebooks: int
    codebook_size: int
    codebook_dim: int
    sampling_rate: int
    hidden_size: int
    upsampling_ratios: tuple[int, ...]

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> DacConfig:
        """Upstream's defaults for absent fields; a value this port cannot honour is
        ``EngineUnavailable`` naming the field."""
        get = {**_DEFAULTS, **config}
        try:
            down = _ints(get, "downsampling_ratios")
            width = _positive(get, "encoder_hidden_size")
            out = cls(
                encoder_hidden_size=width,
                downsampling_ratios=down,
                decoder_hidden_size=_positive(get, "decoder_hidden_size"),
                n_codebooks=_positive(get, "n_codebooks"),
                codebook_size=_positive(get, "codebook_size"),
                codebook_dim=_positive(get, "codebook_dim"),
                sampling_rate=_positive(get, "sampling_rate"),
                hidden_size=_positive({"hidden_size": width << len(down), **config}, "hidden_size"),
                upsampling_ratios=_ints(
                    {"upsampling_ratios": down[::-1], **config}, "upsampling_ratios"
                ),
            )
        except (TypeError, ValueError) as error:
            raise EngineUnavailable(f"dac config: {error}") from error
        if out.codebook_size & (out.codebook_size - 1):
            raise EngineUnavailable(
                f"dac config: codebook_size must be a power of 2, got {out.codebook_size}"
            )
        if out.decoder_hidden_size >> len(out.upsampling_ratios) < 1:
            raise EngineUnavailable(
                f"dac config: decoder_hidden_size {out.decoder_hidden_size} halves to no channel "
                f"in {len(out.upsampling_ratios)} upsampling_ratios"
            )
        return out

    @property
    def hop_length(self) -> int:
        """Audio samples per code frame (upstream's, from ``downsampling_ratios``)."""
        return math.prod(self.downsampling_ratios)

    @property
    def shortest_audio(self) -> int:
        """The fewest samples every strided conv of the encoder still has a frame of."""
        samples = 1
        while not all(n >= 1 for n in _encoder_lengths(samples, self.downsampling_ratios)):
            samples += 1
        return samples

    @property
    def shortest_codes(self) -> int:
        """The fewest code frames every block of the decoder still has a sample of (only a
        stride-1 block shortens: by one)."""
        frames = 1
        while not all(n >= 1 for n in _decoder_lengths(frames, self.upsampling_ratios)):
            frames += 1
        return frames


def _decoder_lengths(frames: int, strides: Sequence[int]) -> list[int]:
    lengths = [frames]
    for stride in strides:  # transposed, kernel 2s, padding ceil(s / 2)
        lengths.append((lengths[-1] - 1) * stride - 2 * math.ceil(stride / 2) + 2 * stride)
    return lengths


def _encoder_lengths(samples: int, strides: Sequence[int]) -> list[int]:
    lengths = [samples]
    for stride in strides:  # kernel 2s, padding ceil(s / 2)
        lengths.append((lengths[-1] + 2 * math.ceil(stride / 2) - 2 * stride) // stride + 1)
    return lengths


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


class Snake1d(nn.Module):
    """``x + sin(alpha x)^2 / (alpha + 1e-9)``, one ``alpha`` per channel."""

    def __init__(self, channels: int, **factory: Any) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.empty(1, channels, 1, **factory))

    def forward(self, x: Tensor) -> Tensor:
        # Upstream's reshapes are views, kept because a view may restride a length-1 time axis,
        # and a conv's kernel choice (so its rounding) follows its input's strides.
        shape = x.shape
        x = x.reshape(shape[0], shape[1], -1)
        x = x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)
        return x.reshape(shape)


class DacResidualUnit(nn.Module):
    def __init__(self, channels: int, dilation: int, **factory: Any) -> None:
        super().__init__()
        self.snake1 = Snake1d(channels, **factory)
        self.conv1 = default.Conv1d(
            channels, channels, 7, dilation=dilation, padding=3 * dilation, **factory
        )
        self.snake2 = Snake1d(channels, **factory)
        self.conv2 = default.Conv1d(channels, channels, 1, **factory)

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv2(self.snake2(self.conv1(self.snake1(x))))
        return x + y  # the 7-tap conv is padded to keep the length, so nothing is trimmed


def _units(channels: int, **factory: Any) -> tuple[DacResidualUnit, ...]:
    return tuple(DacResidualUnit(channels, d, **factory) for d in (1, 3, 9))


class DacEncoderBlock(nn.Module):
    def __init__(self, channels: int, stride: int, **factory: Any) -> None:
        super().__init__()  # channels -> 2 * channels, time / stride
        self.res_unit1, self.res_unit2, self.res_unit3 = _units(channels, **factory)
        self.snake1 = Snake1d(channels, **factory)
        self.conv1 = default.Conv1d(
            channels,
            2 * channels,
            2 * stride,
            stride=stride,
            padding=math.ceil(stride / 2),
            **factory,
        )

    def forward(self, x: Tensor) -> Tensor:
        x = self.res_unit3(self.res_unit2(self.res_unit1(x)))
        return self.conv1(self.snake1(x))


class DacDecoderBlock(nn.Module):
    def __init__(self, channels: int, stride: int, **factory: Any) -> None:
        super().__init__()  # channels -> channels / 2, time * stride
        self.snake1 = Snake1d(channels, **factory)
        self.conv_t1 = default.ConvTranspose1d(
            channels,
            channels // 2,
            2 * stride,
            stride=stride,
            padding=math.ceil(stride / 2),
            **factory,
        )
        self.res_unit1, self.res_unit2, self.res_unit3 = _units(channels // 2, **factory)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv_t1(self.snake1(x))
        return self.res_unit3(self.res_unit2(self.res_unit1(x)))


class DacEncoder(nn.Module):
    def __init__(self, config: DacConfig, **factory: Any) -> None:
        super().__init__()
        width = config.encoder_hidden_size
        self.conv1 = default.Conv1d(1, width, 7, padding=3, **factory)
        self.block = nn.ModuleList(
            DacEncoderBlock(width << i, stride, **factory)
            for i, stride in enumerate(config.downsampling_ratios)
        )
        width <<= len(config.downsampling_ratios)
        self.snake1 = Snake1d(width, **factory)
        self.conv2 = default.Conv1d(width, config.hidden_size, 3, padding=1, **factory)

    def forward(self, audio: Tensor) -> Tensor:
        x = self.conv1(audio)  # [B, width, T]
        for block in self.block:
            x = block(x)
        return self.conv2(self.snake1(x))  # [B, hidden_size, frames]


class DacDecoder(nn.Module):
    def __init__(self, config: DacConfig, **factory: Any) -> None:
        super().__init__()
        width = config.decoder_hidden_size
        self.conv1 = default.Conv1d(config.hidden_size, width, 7, padding=3, **factory)
        self.block = nn.ModuleList(
            DacDecoderBlock(width >> i, stride, **factory)
            for i, stride in enumerate(config.upsampling_ratios)
        )
        width >>= len(config.upsampling_ratios)
        self.snake1 = Snake1d(width, **factory)
        self.conv2 = default.Conv1d(width, 1, 7, padding=3, **factory)

    def forward(self, latent: Tensor) -> Tensor:
        x = self.conv1(latent)
        for block in self.block:
            x = block(x)
        return torch.tanh(self.conv2(self.snake1(x)))  # [B, 1, T]


class DacVectorQuantize(nn.Module):
    """One codebook, searched after projecting to ``codebook_dim`` (factorised codes)."""

    def __init__(self, config: DacConfig, **factory: Any) -> None:
        super().__init__()
        self.in_proj = default.Conv1d(config.hidden_size, config.codebook_dim, 1, **factory)
        self.out_proj = default.Conv1d(config.codebook_dim, config.hidden_size, 1, **factory)
        self.codebook = default.Embedding(config.codebook_size, config.codebook_dim, **factory)

    def lookup(self, codes: Tensor) -> Tensor:
        """The projected codebook vectors ``[B, hidden_size, frames]`` of ``codes``."""
        return self.out_proj(self.codebook(codes).transpose(1, 2))

    def nearest(self, latent: Tensor) -> Tensor:
        """Codes ``[B, frames]`` of ``latent`` ``[B, codebook_dim, frames]``: the largest cosine
        similarity, written as upstream's negated squared distance so ties and rounding agree."""
        batch, dim, frames = latent.shape
        queries = F.normalize(latent.permute(0, 2, 1).reshape(batch * frames, dim))
        book = F.normalize(self.codebook.weight)
        norms = queries.pow(2).sum(1, keepdim=True)
        score = -(norms - 2 * queries @ book.t()) + book.pow(2).sum(1, keepdim=True).t()
        return score.max(1)[1].reshape(batch, frames)


class DacResidualVectorQuantizer(nn.Module):
    def __init__(self, config: DacConfig, **factory: Any) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(
            DacVectorQuantize(config, **factory) for _ in range(config.n_codebooks)
        )

    def _books(self) -> list[DacVectorQuantize]:
        return [cast(DacVectorQuantize, q) for q in self.quantizers]

    def encode(self, latent: Tensor, n_quantizers: int) -> Tensor:
        codes = []
        residual = latent
        for i, quantizer in enumerate(self._books()[:n_quantizers]):
            projected = quantizer.in_proj(residual)
            index = quantizer.nearest(projected)
            codes.append(index)
            if i + 1 < n_quantizers:  # the last residual is never read
                chosen = quantizer.codebook(index).transpose(1, 2)
                # Upstream's straight-through estimator, kept: its rounding reaches the codes.
                chosen = projected + (chosen - projected)
                residual = residual - quantizer.out_proj(chosen)
        return torch.stack(codes, dim=1)  # [B, n_quantizers, frames]

    def decode(self, codes: Tensor) -> Tensor:
        books = self._books()[: codes.shape[1]]
        # As upstream: 0.0 plus the first (a new tensor, -0.0 made +0.0), the others added in
        # place; even the in-place choice is kept, as it decides the strides the next conv sees.
        total = books[0].lookup(codes[:, 0]) + 0.0
        for i, quantizer in enumerate(books[1:], start=1):
            total.add_(quantizer.lookup(codes[:, i]))
        return total  # [B, hidden_size, frames]


class _Dac(nn.Module):
    def __init__(self, config: DacConfig, **factory: Any) -> None:
        super().__init__()
        self.encoder = DacEncoder(config, **factory)
        self.decoder = DacDecoder(config, **factory)
        self.quantizer = DacResidualVectorQuantizer(config, **factory)


class DacCodec:
    """A loaded DAC: ``encode(audio)`` is ``DacModel.encode(audio).audio_codes`` and
    ``decode(codes)`` is ``DacModel.decode(audio_codes=codes).audio_values`` with the channel kept.

    Calls hold no state, so threads may share one codec. ``handles`` (encoder, quantizer, decoder)
    let a memory manager place the weights; encoder and decoder stream block by block.
    """

    def __init__(self, model: _Dac, config: DacConfig, handles: tuple[ModelHandle, ...]) -> None:
        self.config = config
        self.handles = handles
        self.encoder = model.encoder
        self.quantizer = model.quantizer
        self.decoder = model.decoder
        self.sample_rate = config.sampling_rate
        self.hop_length = config.hop_length
        self._shortest = config.shortest_audio

    @property
    def device(self) -> torch.device:
        return self.encoder.conv1.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.encoder.conv1.weight.dtype

    def encode(self, audio: Tensor, n_quantizers: int | None = None) -> Tensor:
        """Codes ``[B, n_quantizers, frames]`` (int64) of ``audio`` ``[B, 1, T]``; the first
        ``n_quantizers`` codebooks, all of them by default."""
        if not isinstance(audio, Tensor) or not audio.is_floating_point():
            raise ValueError(f"audio: expected a floating-point tensor, got {_what(audio)}")
        if audio.dim() != 3 or audio.shape[1] != 1:
            raise ValueError(f"audio: expected [batch, 1, samples], got {list(audio.shape)}")
        if audio.shape[2] < self._shortest:
            raise ValueError(
                f"audio: expected at least {self._shortest} samples, got {audio.shape[2]}"
            )
        count = self.config.n_codebooks
        if n_quantizers is None:
            n_quantizers = count
        if isinstance(n_quantizers, bool) or not isinstance(n_quantizers, int):
            raise ValueError(f"n_quantizers: expected an integer, got {n_quantizers!r}")
        if not 1 <= n_quantizers <= count:
            raise ValueError(f"n_quantizers: expected 1 to {count}, got {n_quantizers}")
        audio = audio.to(device=self.device, dtype=self.dtype)
        with torch.inference_mode():
            return self.quantizer.encode(self.encoder(audio), n_quantizers)

    def decode(self, codes: Tensor) -> Tensor:
        """Audio ``[B, 1, T]`` of ``codes`` ``[B, K, frames]``, K the first codebooks (1 to
        ``n_codebooks``)."""
        integer = isinstance(codes, Tensor) and not codes.is_floating_point()
        if not integer or codes.is_complex() or codes.dtype == torch.bool:
            raise ValueError(f"codes: expected an integer tensor, got {_what(codes)}")
        count, size = self.config.n_codebooks, self.config.codebook_size
        if codes.dim() != 3 or not 1 <= codes.shape[1] <= count or codes.shape[2] < 1:
            raise ValueError(
                f"codes: expected [batch, 1 to {count} codebooks, frames], got {list(codes.shape)}"
            )
        shortest = self.config.shortest_codes
        if codes.shape[2] < shortest:
            raise ValueError(f"codes: expected at least {shortest} frames, got {codes.shape[2]}")
        if codes.numel() and (codes.min() < 0 or codes.max() >= size):
            raise ValueError(f"codes: expected values in 0..{size - 1}")
        codes = codes.to(device=self.device, dtype=torch.long)
        with torch.inference_mode():
            return self.decoder(self.quantizer.decode(codes))


def _what(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor"
    return f"a {type(value).__name__}"


def fold_weight_norm(state_dict: Mapping[str, Tensor], dtype: torch.dtype) -> dict[str, Tensor]:
    """Weight-norm pairs replaced by the weight torch's parametrization computes from them in
    ``dtype`` (``torch._weight_norm(v, g, dim)``, its fused kernel included), so the bits are
    those of upstream's forward; other tensors are kept as they are."""
    names = (
        ("weight_g", "weight_v"),
        ("parametrizations.weight.original0", "parametrizations.weight.original1"),
    )
    out = dict(state_dict)
    for key in list(state_dict):
        for g_name, v_name in names:
            if key != g_name and not key.endswith("." + g_name):
                continue
            base = key[: -len(g_name)]
            g, v = out.pop(key), out.pop(base + v_name, None)
            if v is None:
                raise ValueError(f"{key}: its pair {base + v_name} is missing")
            sizes = [i for i, n in enumerate(g.shape) if n != 1]
            dim = -1 if g.dim() == 0 else (sizes[0] if sizes else 0)
            out[base + "weight"] = torch._weight_norm(v.to(dtype), g.to(dtype), dim)
    return out


def build(
    config: Mapping[str, Any],
    state_dict: Mapping[str, Tensor],
    *,
    device: str,
    dtype: torch.dtype,
    name: str = "dac",
) -> DacCodec:
    """The codec of a ``dac`` folder, its weights loaded strictly from ``state_dict`` (shared, not
    copied, when device and dtype already match); its handles are named ``NAME:encoder``,
    ``NAME:quantizer`` and ``NAME:decoder``."""
    parsed = DacConfig.from_dict(config)
    with torch.device("meta"):
        model = _Dac(parsed, dtype=dtype)
    load_into(model, fold_weight_norm(state_dict, dtype), cast=True)
    model.to(device).eval()
    handles = (
        ModelHandle(model.encoder, name=f"{name}:encoder", load_device=device),
        ModelHandle(model.quantizer, name=f"{name}:quantizer", load_device=device, units=()),
        ModelHandle(model.decoder, name=f"{name}:decoder", load_device=device),
    )
    return DacCodec(model, parsed, handles)
