"""Vocos as gemelo-ai's ``vocos.Vocos`` (mel variant): a log-mel spectrogram in, a waveform out.

The vocoder of Siuzdak, "Vocos: Closing the gap between time-domain and Fourier-based neural
vocoders for high-quality audio synthesis" (2023), as the ``vocos`` package (0.1.0) builds it from
a ``config.yaml``: a ``VocosBackbone`` (a 7-tap conv, a layer norm, ConvNeXt blocks of depthwise
conv, layer norm, two linears around a GELU and a layer scale ``gamma``, and a final layer norm)
and an ``ISTFTHead`` (a linear to ``n_fft + 2`` values per frame, read as log-magnitude and phase,
inverted by ``torch.istft`` for ``padding: center`` or by upstream's own overlap-add for
``padding: same``). ``MelSpectrogramFeatures`` (torchaudio's ``MelSpectrogram`` with power 1,
then ``log(clip(x, 1e-7))``) is exposed as ``features``: its window and filter bank are buffers
of the checkpoint and are used as stored.

Parameter names are upstream's, so ``pytorch_model.bin`` as the Hub ships it
(``charactr/vocos-mel-24khz``) loads as it is, strictly. Upstream's op order is kept, so float32
on the CPU equals it bit for bit. Not built: the EnCodec-features variant (its backbone is
conditioned by ``AdaLayerNorm`` on a bandwidth id), the ResNet backbone and the IMDCT heads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.nn import _fields
from mizuoto_runtime.ops import default
from mizuoto_runtime.weights.loading import load_into
from mizuoto_sdk.errors import EngineUnavailable

__all__ = ["VocosConfig", "VocosVocoder", "build"]

FEATURES = "vocos.feature_extractors.MelSpectrogramFeatures"
BACKBONE = "vocos.models.VocosBackbone"
HEAD = "vocos.heads.ISTFTHead"
_MEL_DEFAULTS = {"sample_rate": 24000, "n_fft": 1024, "hop_length": 256, "n_mels": 100}


@dataclass(frozen=True)
class VocosConfig:
    """What ``config.yaml`` says of the three parts (their ``init_args``, upstream's defaults
    for absent ones)."""

    sample_rate: int
    n_mels: int
    feature_n_fft: int
    feature_hop_length: int
    feature_padding: str
    input_channels: int
    dim: int
    intermediate_dim: int
    num_layers: int
    layer_scale: float  # upstream's initial layer scale: the blocks have a gamma if it is > 0
    n_fft: int
    hop_length: int
    padding: str

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> VocosConfig:
        """A config this port cannot build is ``EngineUnavailable`` naming the field."""
        try:
            features = _part(config, "feature_extractor", FEATURES)
            backbone = _part(config, "backbone", BACKBONE)
            head = _part(config, "head", HEAD)
            mel = {**_MEL_DEFAULTS, "padding": "center", **features}
            where_f, where_b, where_h = (f"{p}.init_args." for p in _PARTS)
            if backbone.get("adanorm_num_embeddings") is not None:
                raise ValueError(
                    f"{where_b}adanorm_num_embeddings: the bandwidth-conditioned backbone "
                    "(EnCodec features) is not built; expected it absent or null"
                )
            layers = _fields.positive(backbone, "num_layers", where=where_b)
            # Upstream: ``value or 1 / num_layers``, and no gamma unless that is above 0.
            scale = 1 / layers
            if backbone.get("layer_scale_init_value"):
                scale = _fields.real(backbone, "layer_scale_init_value", where=where_b)
            out = cls(
                sample_rate=_fields.positive(mel, "sample_rate", where=where_f),
                n_mels=_fields.positive(mel, "n_mels", where=where_f),
                feature_n_fft=_fields.positive(mel, "n_fft", where=where_f),
                feature_hop_length=_fields.positive(mel, "hop_length", where=where_f),
                feature_padding=_fields.choice(mel, "padding", _PADDINGS, where=where_f),
                input_channels=_fields.positive(backbone, "input_channels", where=where_b),
                dim=_fields.positive(backbone, "dim", where=where_b),
                intermediate_dim=_fields.positive(backbone, "intermediate_dim", where=where_b),
                num_layers=layers,
                layer_scale=scale,
                n_fft=_fields.positive(head, "n_fft", where=where_h),
                hop_length=_fields.positive(head, "hop_length", where=where_h),
                padding=_fields.choice(
                    {"padding": "same", **head}, "padding", _PADDINGS, where=where_h
                ),
            )
            if _fields.positive(head, "dim", where=where_h) != out.dim:
                raise ValueError(f"{where_h}dim: expected the backbone's dim {out.dim}")
        except ValueError as error:
            raise EngineUnavailable(f"vocos config: {error}") from error
        _check_transforms(out)
        return out

    @property
    def shortest_mel(self) -> int:
        """The fewest frames the head inverts: ``torch.istft`` with ``center`` returns
        ``(frames - 1) * hop_length`` samples, none for one frame (upstream then fails)."""
        return 2 if self.padding == "center" else 1


_PARTS = ("feature_extractor", "backbone", "head")
_PADDINGS = ("center", "same")


def _part(config: Mapping[str, Any], name: str, class_path: str) -> Mapping[str, Any]:
    part = _fields.section(config, name)
    found = part.get("class_path")
    if found != class_path:
        raise ValueError(f"{name}.class_path: expected {class_path!r}, got {found!r}")
    args = part.get("init_args", {})
    if not isinstance(args, Mapping):
        raise ValueError(f"{name}.init_args: expected a mapping, got {args!r}")
    return args


def _check_transforms(config: VocosConfig) -> None:
    """Refuse, when loading, transforms whose shapes upstream's forward cannot run."""
    if config.n_fft % 2 or config.hop_length > config.n_fft:
        # n_fft + 2 outputs halve into n_fft // 2 + 1 magnitudes and phases only when even.
        raise EngineUnavailable(
            "vocos config: head.init_args.n_fft must be even and at least hop_length, got "
            f"n_fft {config.n_fft}, hop_length {config.hop_length}"
        )
    if config.padding == "same" and config.n_fft - config.hop_length < 2:
        # Upstream trims (n_fft - hop) // 2 samples from each end; 0 leaves an empty slice.
        raise EngineUnavailable(
            "vocos config: head.init_args.hop_length must be at most n_fft - 2 with padding "
            f"'same', got {config.hop_length} for n_fft {config.n_fft}"
        )
    if config.feature_hop_length > config.feature_n_fft:
        raise EngineUnavailable(
            "vocos config: feature_extractor.init_args.hop_length must be at most its n_fft, got "
            f"{config.feature_hop_length} for {config.feature_n_fft}"
        )


class ConvNeXtBlock(nn.Module):
    """Depthwise 7-tap conv, layer norm, pointwise MLP with GELU, layer scale, residual."""

    def __init__(self, config: VocosConfig, **factory: Any) -> None:
        super().__init__()
        dim = config.dim
        self.dwconv = default.Conv1d(dim, dim, 7, padding=3, groups=dim, **factory)
        self.norm = default.LayerNorm(dim, eps=1e-6, **factory)
        self.pwconv1 = default.Linear(dim, config.intermediate_dim, **factory)
        self.pwconv2 = default.Linear(config.intermediate_dim, dim, **factory)
        has_gamma = config.layer_scale > 0
        self.gamma = nn.Parameter(torch.empty(dim, **factory)) if has_gamma else None

    def forward(self, x: Tensor) -> Tensor:
        residual = x
        x = self.dwconv(x).transpose(1, 2)  # [B, T, C]
        x = self.pwconv2(F.gelu(self.pwconv1(self.norm(x))))
        if self.gamma is not None:
            x = self.gamma * x
        return residual + x.transpose(1, 2)  # [B, C, T]


class VocosBackbone(nn.Module):
    """Features ``[B, C, T]`` to hidden states ``[B, T, dim]``."""

    def __init__(self, config: VocosConfig, **factory: Any) -> None:
        super().__init__()
        self.embed = default.Conv1d(config.input_channels, config.dim, 7, padding=3, **factory)
        self.norm = default.LayerNorm(config.dim, eps=1e-6, **factory)
        self.convnext = nn.ModuleList(
            ConvNeXtBlock(config, **factory) for _ in range(config.num_layers)
        )
        self.final_layer_norm = default.LayerNorm(config.dim, eps=1e-6, **factory)

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm(self.embed(x).transpose(1, 2)).transpose(1, 2)
        for block in self.convnext:
            x = block(x)
        return self.final_layer_norm(x.transpose(1, 2))


class ISTFT(nn.Module):
    """Upstream's inverse STFT: ``torch.istft`` for ``center``; for ``same``, its own
    overlap-add by ``F.fold`` trimmed by ``(n_fft - hop) // 2`` and divided by the folded squared
    window (``torch.istft`` cannot trim before its overlap check)."""

    window: Tensor

    def __init__(self, config: VocosConfig, **factory: Any) -> None:
        super().__init__()
        self.n_fft, self.hop_length, self.padding = config.n_fft, config.hop_length, config.padding
        self.register_buffer("window", torch.empty(config.n_fft, **factory))

    def forward(self, spec: Tensor) -> Tensor:
        n_fft, hop, window = self.n_fft, self.hop_length, self.window
        if self.padding == "center":
            return torch.istft(spec, n_fft, hop, n_fft, window, center=True)
        pad = (n_fft - hop) // 2
        frames = spec.shape[-1]
        frames_out = torch.fft.irfft(spec, n_fft, dim=1, norm="backward")
        frames_out = frames_out * window[None, :, None]
        size, kernel, stride = (1, (frames - 1) * hop + n_fft), (1, n_fft), (1, hop)
        y = F.fold(frames_out, output_size=size, kernel_size=kernel, stride=stride)
        y = y[:, 0, 0, pad:-pad]
        window_sq = window.square().expand(1, frames, -1).transpose(1, 2)
        envelope = F.fold(window_sq, output_size=size, kernel_size=kernel, stride=stride)
        envelope = envelope.squeeze()[pad:-pad]
        if not bool((envelope > 1e-11).all()):
            raise ValueError("vocos: the window's overlap-add envelope is zero inside the output")
        return y / envelope


class ISTFTHead(nn.Module):
    """Hidden states ``[B, T, dim]`` to a waveform ``[B, samples]``."""

    def __init__(self, config: VocosConfig, **factory: Any) -> None:
        super().__init__()
        self.out = default.Linear(config.dim, config.n_fft + 2, **factory)
        self.istft = ISTFT(config, **factory)

    def forward(self, x: Tensor) -> Tensor:
        mag, phase = self.out(x).transpose(1, 2).chunk(2, dim=1)
        mag = torch.clip(torch.exp(mag), max=1e2)
        # Upstream's complex arithmetic as it writes it, so the rounding is its own.
        spec = mag * (torch.cos(phase) + 1j * torch.sin(phase))
        return self.istft(spec)


class _Spectrogram(nn.Module):
    window: Tensor

    def __init__(self, n_fft: int, **factory: Any) -> None:
        super().__init__()
        self.register_buffer("window", torch.empty(n_fft, **factory))


class _MelScale(nn.Module):
    fb: Tensor

    def __init__(self, n_fft: int, n_mels: int, **factory: Any) -> None:
        super().__init__()
        self.register_buffer("fb", torch.empty(n_fft // 2 + 1, n_mels, **factory))


class _MelSpectrogram(nn.Module):
    def __init__(self, config: VocosConfig, **factory: Any) -> None:
        super().__init__()
        self.spectrogram = _Spectrogram(config.feature_n_fft, **factory)
        self.mel_scale = _MelScale(config.feature_n_fft, config.n_mels, **factory)


class MelSpectrogramFeatures(nn.Module):
    """Audio ``[B, T]`` to ``log(clip(mel, 1e-7))`` ``[B, n_mels, frames]``, as torchaudio's
    ``MelSpectrogram(power=1)`` computes the mel: ``stft`` (reflect-padded by ``center``, or by
    hand for ``same``), ``abs``, ``matmul`` with the filter bank."""

    def __init__(self, config: VocosConfig, **factory: Any) -> None:
        super().__init__()
        self.n_fft, self.hop_length = config.feature_n_fft, config.feature_hop_length
        self.padding = config.feature_padding
        self.mel_spec = _MelSpectrogram(config, **factory)

    def forward(self, audio: Tensor) -> Tensor:
        if self.padding == "same":
            pad = (self.n_fft - self.hop_length) // 2
            audio = F.pad(audio, (pad, pad), mode="reflect")
        spec = torch.stft(
            audio,
            self.n_fft,
            self.hop_length,
            self.n_fft,
            self.mel_spec.spectrogram.window,
            center=self.padding == "center",
            pad_mode="reflect",
            normalized=False,
            onesided=True,
            return_complex=True,
        ).abs()
        mel = torch.matmul(spec.transpose(-1, -2), self.mel_spec.mel_scale.fb).transpose(-1, -2)
        return torch.log(torch.clip(mel, min=1e-7))


class Vocos(nn.Module):
    """Upstream's ``Vocos``: ``decode(features)`` is ``head(backbone(features))``."""

    def __init__(self, config: VocosConfig, **factory: Any) -> None:
        super().__init__()
        self.config = config
        # Always float32: torch's CPU FFT has no bfloat16 (upstream's features fail there), and
        # the filter bank would lose its precision; the mel is cast as the vocoder takes it.
        self.feature_extractor = MelSpectrogramFeatures(
            config, **{**factory, "dtype": torch.float32}
        )
        self.backbone = VocosBackbone(config, **factory)
        self.head = ISTFTHead(config, **factory)

    def forward(self, features: Tensor) -> Tensor:
        return self.head(self.backbone(features))


class VocosVocoder:
    """A loaded Vocos: ``vocoder(mel)`` is ``Vocos.decode(mel)``; ``vocoder.features(audio)`` is
    its feature extractor, so ``vocoder(vocoder.features(audio))`` is upstream's copy-synthesis.

    ``mel`` is ``[B, n_mels, frames]`` (waveform ``[B, samples]``) or ``[n_mels, frames]``
    (waveform ``[samples]``), channels first as upstream takes it; ``audio`` is ``[B, T]`` or
    ``[T]``. Inputs are moved to the vocoder's device and dtype. The waveform is float32 when
    the vocoder is bfloat16, as upstream's: its head turns the spectrum complex (complex64).
    Calls hold no state, so threads may share one vocoder.
    """

    def __init__(self, module: Vocos, handles: tuple[ModelHandle, ...]) -> None:
        self.module = module
        self.config = module.config
        self.handles = handles
        self.sample_rate = module.config.sample_rate
        self.hop_length = module.config.hop_length

    @property
    def device(self) -> torch.device:
        return self.module.backbone.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.module.backbone.embed.weight.dtype

    def __call__(self, mel: Tensor) -> Tensor:
        channels = self.config.input_channels
        _float(mel, "mel")
        if mel.dim() not in (2, 3) or mel.shape[-2] != channels:
            raise ValueError(
                f"mel: expected [batch, {channels}, frames] or [{channels}, frames], got "
                f"{list(mel.shape)}"
            )
        shortest = self.config.shortest_mel
        if mel.shape[-1] < shortest:
            raise ValueError(
                f"mel: expected at least {shortest} frame(s) with padding "
                f"{self.config.padding!r}, got {mel.shape[-1]}"
            )
        return self._run(self.module, mel, self.dtype, batched=mel.dim() == 3)

    def features(self, audio: Tensor) -> Tensor:
        """``MelSpectrogramFeatures(audio)``: ``[B, T]`` -> ``[B, n_mels, frames]``, always in
        float32 (upstream's float32 bits, whatever the vocoder's dtype)."""
        _float(audio, "audio")
        if audio.dim() not in (1, 2):
            raise ValueError(
                f"audio: expected [batch, samples] or [samples], got {list(audio.shape)}"
            )
        # Reflect padding needs more samples than it pads, and a frame must fit after it.
        n_fft, pad = self.config.feature_n_fft, self.config.feature_n_fft // 2
        if self.config.feature_padding == "same":
            pad = (n_fft - self.config.feature_hop_length) // 2
        shortest = max(pad + 1, n_fft - 2 * pad)
        if audio.shape[-1] < shortest:
            raise ValueError(f"audio: expected at least {shortest} samples, got {audio.shape[-1]}")
        features = self.module.feature_extractor
        return self._run(features, audio, torch.float32, batched=audio.dim() == 2)

    def _run(self, module: nn.Module, x: Tensor, dtype: torch.dtype, *, batched: bool) -> Tensor:
        x = x.to(device=self.device, dtype=dtype)
        with torch.inference_mode():
            out = module(x if batched else x.unsqueeze(0))
        return out if batched else out[0]


def _float(value: object, name: str) -> None:
    if not isinstance(value, Tensor) or not value.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point tensor, got {_fields.what(value)}")


def build(
    config: Mapping[str, Any],
    state_dict: Mapping[str, Tensor],
    *,
    device: str,
    dtype: torch.dtype,
    name: str = "vocos",
) -> VocosVocoder:
    """The vocoder of a Vocos folder (``config`` is its parsed ``config.yaml``), its weights and
    buffers loaded strictly from ``state_dict``; its handle is named ``NAME:vocoder``, its
    ConvNeXt blocks the streamable units."""
    parsed = VocosConfig.from_dict(config)
    with torch.device("meta"):
        module = Vocos(parsed, dtype=dtype)
    load_into(module, state_dict, cast=True)
    module.to(device).eval()
    units = list(module.backbone.convnext)
    handle = ModelHandle(module, name=f"{name}:vocoder", load_device=device, units=units)
    return VocosVocoder(module, (handle,))
