"""Mimi (Kyutai, 2024) as transformers 5.24's ``MimiModel``: SEANet encoder, encoder transformer
and downsampling conv; split residual quantizer (semantic + acoustic); upsampling conv, decoder
transformer and SEANet decoder. Loaded from a ``save_pretrained`` folder (the flat layout Hub
checkpoints use: ``encoder.layers``, ``encoder_transformer``, ``downsample``, ...).

``encode`` equals ``MimiModel.encode(audio, num_quantizers=...).audio_codes`` and ``decode``
equals ``MimiModel.decode(codes).audio_values``, bit for bit in float32 on the CPU.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.nn.mimi_transformer import Cache, Transformer, TransformerSettings
from mizuoto_runtime.nn.seanet import (
    ConvTranspose1d,
    NormConv1d,
    ResnetBlock,
    StreamState,
    step_layers,
    warmup_frames,
)
from mizuoto_runtime.ops import default
from mizuoto_runtime.weights.loading import load_into
from mizuoto_sdk.errors import EngineUnavailable

__all__ = ["MimiCodec", "MimiStreamDecoder", "build"]

_CODEBOOK_STATS = ("*.codebook.initialized",)
_EPSILON = 1e-5  # upstream's clamp on a codebook entry's usage


class _Settings:
    def __init__(self, config: dict[str, Any]) -> None:
        if config.get("use_streaming"):
            raise EngineUnavailable(
                "mimi: config use_streaming=True is not supported (upstream then pads its causal "
                "convs from a cache and drops the right padding); use stream_decoder() instead"
            )
        if isinstance(config.get("residual_kernel_size"), list):
            raise EngineUnavailable("mimi: config residual_kernel_size as a list is not supported")
        self.channels = int(config.get("audio_channels", 1))
        self.hidden = int(config.get("hidden_size", 512))
        self.num_filters = int(config.get("num_filters", 64))
        self.residual_layers = int(config.get("num_residual_layers", 1))
        self.ratios = [int(r) for r in config.get("upsampling_ratios") or (8, 6, 5, 4)]
        self.kernel_size = int(config.get("kernel_size", 7))
        self.last_kernel_size = int(config.get("last_kernel_size", 3))
        self.residual_kernel_size = int(config.get("residual_kernel_size", 3))
        self.dilation_growth = int(config.get("dilation_growth_rate", 2))
        self.causal = bool(config.get("use_causal_conv", True))
        self.pad_mode = str(config.get("pad_mode", "constant"))
        self.compress = int(config.get("compress", 2))
        self.trim_right_ratio = float(config.get("trim_right_ratio", 1.0))
        self.conv_shortcut = bool(config.get("use_conv_shortcut", False))
        self.codebook_size = int(config.get("codebook_size", 2048))
        self.codebook_dim = int(config.get("codebook_dim") or self.hidden)
        self.quantizers = int(config.get("num_quantizers", 32))
        self.semantic = int(config.get("num_semantic_quantizers", 1))
        self.vq_dim = int(config.get("vector_quantization_hidden_dimension", 256))
        self.upsample_groups = int(config.get("upsample_groups", 512))
        sampling_rate = int(config.get("sampling_rate", 24_000))
        hop = math.prod(self.ratios)
        encodec_rate = math.ceil(sampling_rate / hop)
        frame_rate = config.get("frame_rate") or config.get("_frame_rate")
        frame_rate = sampling_rate / (hop * 2) if frame_rate is None else float(frame_rate)
        self.resample = frame_rate != encodec_rate
        self.latent_stride = int(encodec_rate / frame_rate)
        self.frame_rate = frame_rate
        self.transformer = TransformerSettings(config)

    def conv(self, cin: int, cout: int, kernel: int, stride: int = 1) -> NormConv1d:
        return NormConv1d(
            cin, cout, kernel, stride=stride, causal=self.causal, pad_mode=self.pad_mode
        )

    def residuals(self, dim: int) -> list[nn.Module]:
        return [
            ResnetBlock(
                dim,
                dim // self.compress,
                self.residual_kernel_size,
                self.dilation_growth**j,
                causal=self.causal,
                pad_mode=self.pad_mode,
                conv_shortcut=self.conv_shortcut,
            )
            for j in range(self.residual_layers)
        ]


class _Seanet(nn.Module):
    """The SEANet encoder or decoder (no LSTM in Mimi): ``layers`` run in order."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _encoder(s: _Settings) -> _Seanet:
    layers: list[nn.Module] = [s.conv(s.channels, s.num_filters, s.kernel_size)]
    width = s.num_filters
    for ratio in reversed(s.ratios):
        layers += [*s.residuals(width), nn.ELU(), s.conv(width, width * 2, ratio * 2, ratio)]
        width *= 2
    return _Seanet([*layers, nn.ELU(), s.conv(width, s.hidden, s.last_kernel_size)])


def _decoder(s: _Settings) -> _Seanet:
    width = s.num_filters * 2 ** len(s.ratios)
    layers: list[nn.Module] = [s.conv(s.hidden, width, s.kernel_size)]
    for ratio in s.ratios:
        up = ConvTranspose1d(
            width,
            width // 2,
            ratio * 2,
            ratio,
            causal=s.causal,
            trim_right_ratio=s.trim_right_ratio,
        )
        layers += [nn.ELU(), up, *s.residuals(width // 2)]
        width //= 2
    return _Seanet([*layers, nn.ELU(), s.conv(s.num_filters, s.channels, s.last_kernel_size)])


class _Codebook(nn.Module):
    """Entries are ``embed_sum / usage``, computed once at load in the model's dtype."""

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.embed_sum: Tensor = nn.Buffer(torch.empty(size, dim))
        self.cluster_usage: Tensor = nn.Buffer(torch.empty(size))
        self.embed: Tensor = nn.Buffer(torch.empty(size, dim), persistent=False)

    def finish_loading(self) -> None:
        """Compute the entries as upstream's ``embed`` property does; drop the statistics."""
        self.embed = self.embed_sum / self.cluster_usage.clamp(min=_EPSILON)[:, None]
        del self.embed_sum, self.cluster_usage

    def nearest(self, rows: Tensor) -> Tensor:
        """Index of the closest entry to each row [N, D], by ``torch.cdist`` in float32."""
        return torch.cdist(rows[None].float(), self.embed[None].float(), p=2)[0].argmin(dim=-1)


class _Quantization(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.codebook = _Codebook(size, dim)


class _ResidualQuantizer(nn.Module):
    def __init__(self, s: _Settings, count: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [_Quantization(s.codebook_size, s.codebook_dim) for _ in range(count)]
        )
        projected = s.vq_dim != s.hidden
        self.input_proj = default.Conv1d(s.hidden, s.vq_dim, 1, bias=False) if projected else None
        self.output_proj = default.Conv1d(s.vq_dim, s.hidden, 1, bias=False) if projected else None

    def codebook(self, k: int) -> _Codebook:
        return cast(_Quantization, self.layers[k]).codebook

    def encode(self, latents: Tensor, count: int) -> Tensor:
        """[B, hidden, T] -> codes [count, B, T]."""
        residual = latents if self.input_proj is None else self.input_proj(latents)
        codes = []
        for k in range(min(count, len(self.layers))):
            codebook = self.codebook(k)
            rows = residual.permute(0, 2, 1)
            index = codebook.nearest(rows.reshape(-1, rows.shape[-1])).view(*rows.shape[:-1])
            residual = residual - F.embedding(index, codebook.embed).permute(0, 2, 1)
            codes.append(index)
        return torch.stack(codes)

    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, K, T] -> [B, hidden, T]: the entries summed in stage order, projected."""
        total: Tensor | None = None
        for k in range(codes.shape[1]):
            entry = F.embedding(codes[:, k], self.codebook(k).embed).permute(0, 2, 1)
            total = entry if total is None else total + entry
        assert total is not None  # both callers pass one stage at least
        return total if self.output_proj is None else self.output_proj(total)


class _SplitQuantizer(nn.Module):
    def __init__(self, s: _Settings) -> None:
        super().__init__()
        self.semantic = s.semantic
        self.semantic_residual_vector_quantizer = _ResidualQuantizer(s, s.semantic)
        self.acoustic_residual_vector_quantizer = _ResidualQuantizer(s, s.quantizers - s.semantic)

    def encode(self, latents: Tensor, count: int) -> Tensor:
        codes = self.semantic_residual_vector_quantizer.encode(latents, self.semantic)
        if count > self.semantic:
            acoustic = self.acoustic_residual_vector_quantizer.encode(
                latents, count - self.semantic
            )
            codes = torch.cat([codes, acoustic], dim=0)
        return codes.transpose(0, 1)

    def decode(self, codes: Tensor) -> Tensor:
        out = self.semantic_residual_vector_quantizer.decode(codes[:, : self.semantic])
        if codes.shape[1] > self.semantic:
            out = out + self.acoustic_residual_vector_quantizer.decode(codes[:, self.semantic :])
        return out


class _Encoder(nn.Module):
    """Audio [B, C, T] -> latents [B, hidden, frames]: upstream's ``MimiEncoderModel`` parts."""

    def __init__(self, s: _Settings) -> None:
        super().__init__()
        self.encoder = _encoder(s)
        self.encoder_transformer = Transformer(s.transformer)
        self.downsample = (
            NormConv1d(
                s.hidden,
                s.hidden,
                2 * s.latent_stride,
                stride=s.latent_stride,
                causal=s.causal,
                pad_mode="replicate",
                bias=False,
            )
            if s.resample
            else None
        )

    def forward(self, audio: Tensor) -> Tensor:
        x = self.encoder_transformer(self.encoder(audio).transpose(1, 2)).transpose(1, 2)
        return x if self.downsample is None else self.downsample(x)


class _Decoder(nn.Module):
    """Latents [B, hidden, frames] -> audio: upsampling conv, transformer, SEANet decoder."""

    def __init__(self, s: _Settings) -> None:
        super().__init__()
        self.upsample = (
            ConvTranspose1d(
                s.hidden,
                s.hidden,
                2 * s.latent_stride,
                s.latent_stride,
                causal=s.causal,
                trim_right_ratio=s.trim_right_ratio,
                groups=s.upsample_groups,
                bias=False,
            )
            if s.resample
            else None
        )
        self.decoder_transformer = Transformer(s.transformer)
        self.decoder = _decoder(s)

    def forward(self, latents: Tensor) -> Tensor:
        x = latents if self.upsample is None else self.upsample(latents)
        x = self.decoder_transformer(x.transpose(1, 2)).transpose(1, 2)
        return self.decoder(x)

    def step(self, latents: Tensor, state: StreamState, cache: Cache) -> Tensor:
        x = latents if self.upsample is None else self.upsample.step(latents, state)
        x = self.decoder_transformer(x.transpose(1, 2), cache).transpose(1, 2)
        return step_layers(self.decoder.layers, x, state)


class MimiCodec:
    """Audio [B, C, T] <-> codes [B, K, frames]; ``handles`` lets the memory manager place it."""

    def __init__(
        self,
        settings: _Settings,
        encoder: _Encoder,
        decoder: _Decoder,
        quantizer: _SplitQuantizer,
        device: str,
        dtype: torch.dtype,
        name: str = "mimi",
    ) -> None:
        self._settings = settings
        self.encoder, self.decoder, self.quantizer = encoder, decoder, quantizer
        self.dtype = dtype
        self.channels = settings.channels
        self.codebook_size = settings.codebook_size
        self.num_quantizers = settings.quantizers
        self.frame_rate = settings.frame_rate
        self.handles = (
            ModelHandle(encoder, name=f"{name}:encoder", load_device=device, units=_units(encoder)),
            ModelHandle(decoder, name=f"{name}:decoder", load_device=device, units=_units(decoder)),
            ModelHandle(quantizer, name=f"{name}:quantizer", load_device=device, units=()),
        )

    @torch.inference_mode()
    def encode(self, audio: Tensor, num_quantizers: int | None = None) -> Tensor:
        """audio [B, C, T] -> codes [B, K, frames]; K is ``num_quantizers`` (all by default)."""
        if audio.dim() != 3 or audio.shape[1] != self.channels:
            raise ValueError(
                f"audio: expected [batch, {self.channels}, samples], got {list(audio.shape)}"
            )
        count = self.num_quantizers if num_quantizers is None else num_quantizers
        if not self._settings.semantic <= count <= self.num_quantizers:
            raise ValueError(
                f"num_quantizers: expected {self._settings.semantic}..{self.num_quantizers}, "
                f"got {num_quantizers}"
            )
        return self.quantizer.encode(self.encoder(audio.to(self.dtype)), count)

    @torch.inference_mode()
    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, K, frames] -> audio [B, C, samples]."""
        return self.decoder(self.quantizer.decode(self._checked(codes)))

    def stream_decoder(self) -> MimiStreamDecoder:
        """A decoder for consecutive chunks of one code sequence (causal configs)."""
        s = self._settings
        if not s.causal or s.trim_right_ratio != 1.0 or s.pad_mode == "circular":
            raise EngineUnavailable(
                "mimi: streaming needs use_causal_conv=True, trim_right_ratio=1.0 and a pad_mode "
                f"other than 'circular'; this config has use_causal_conv={s.causal}, "
                f"trim_right_ratio={s.trim_right_ratio}, pad_mode={s.pad_mode!r}"
            )
        return MimiStreamDecoder(self)

    def _checked(self, codes: Tensor) -> Tensor:
        if codes.dim() != 3 or not 1 <= codes.shape[1] <= self.num_quantizers:
            raise ValueError(
                f"codes: expected [batch, 1..{self.num_quantizers}, frames], "
                f"got {list(codes.shape)}"
            )
        if codes.dtype.is_floating_point or codes.dtype == torch.bool:
            raise ValueError(f"codes: expected integer codes, got {codes.dtype}")
        if bool(((codes < 0) | (codes >= self.codebook_size)).any()):
            raise ValueError(
                f"codes: expected values in [0, {self.codebook_size}), got out of range"
            )
        return codes


class MimiStreamDecoder:
    """Decodes one code sequence chunk by chunk: the convs' state and the decoder transformer's
    keys and values are carried between chunks. The first frames may be held back (see
    ``seanet.warmup_frames``); the chunks' audio joined equals ``decode`` within float rounding."""

    def __init__(self, codec: MimiCodec) -> None:
        self._codec = codec
        self._state: StreamState = {}
        self._cache = Cache(len(codec.decoder.decoder_transformer.layers))
        self._held: Tensor | None = None
        stride = codec._settings.latent_stride if codec.decoder.upsample is not None else 1
        self.warmup = -(-warmup_frames(codec.decoder.decoder.layers) // stride)

    @torch.inference_mode()
    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, K, n] -> audio of those frames (and of any held back before)."""
        codes = self._codec._checked(codes)
        if self._held is not None:
            codes = torch.cat([self._held, codes], dim=-1)
            self._held = None
        if self._cache.seen == 0 and codes.shape[-1] < self.warmup:
            self._held = codes
            return torch.zeros(
                codes.shape[0],
                self._codec.channels,
                0,
                dtype=self._codec.dtype,
                device=codes.device,
            )
        latents = self._codec.quantizer.decode(codes)
        return self._codec.decoder.step(latents, self._state, self._cache)


def _units(module: nn.Module) -> list[nn.Module]:
    """The transformer layers and the weighted SEANet blocks, in the order they run."""
    units: list[nn.Module] = []
    for child in module.children():
        layers = getattr(child, "layers", None)
        if isinstance(layers, nn.ModuleList):
            units += [m for m in layers if any(True for _ in m.parameters())]
    return units


_PARTS = {
    "encoder.": ("encoder", "encoder."),
    "encoder_transformer.": ("encoder", "encoder_transformer."),
    "downsample.": ("encoder", "downsample."),
    "upsample.": ("decoder", "upsample."),
    "decoder_transformer.": ("decoder", "decoder_transformer."),
    "decoder.": ("decoder", "decoder."),
    "quantizer.": ("quantizer", ""),
}


def build(
    config: dict[str, Any],
    state_dict: dict[str, Tensor],
    *,
    device: str,
    dtype: torch.dtype,
    name: str = "mimi",
) -> MimiCodec:
    """A ``MimiCodec`` from a transformers Mimi config and state dict (flat Hub layout); its
    handles are named ``NAME:encoder``, ``NAME:decoder`` and ``NAME:quantizer``."""
    settings = _Settings(config)
    with torch.device("meta"):
        modules: dict[str, nn.Module] = {
            "encoder": _Encoder(settings).to(dtype),
            "decoder": _Decoder(settings).to(dtype),
            "quantizer": _SplitQuantizer(settings).to(dtype),
        }
    parts: dict[str, dict[str, Tensor]] = {name: {} for name in modules}
    for key, value in state_dict.items():
        head = next((h for h in _PARTS if key.startswith(h)), None)
        if head is None:
            raise EngineUnavailable(f"mimi: unexpected checkpoint key {key!r}")
        owner, prefix = _PARTS[head]
        tensor = value.to(device=device, dtype=dtype) if value.is_floating_point() else value
        parts[owner][prefix + key[len(head) :]] = tensor
    for part, module in modules.items():
        load_into(module, parts[part], ignore=_CODEBOOK_STATS)
        for codebook in module.modules():
            if isinstance(codebook, _Codebook):
                codebook.finish_loading()
    return MimiCodec(
        settings,
        cast(_Encoder, modules["encoder"]),
        cast(_Decoder, modules["decoder"]),
        cast(_SplitQuantizer, modules["quantizer"]),
        device,
        dtype,
        name,
    )
