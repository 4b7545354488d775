"""EnCodec (Défossez et al., 2022) as transformers 5.24's ``EncodecModel``: the SEANet encoder
and decoder and the residual vector quantizer, loaded from a ``save_pretrained`` folder.

``encode`` equals ``EncodecModel.encode(audio, bandwidth=...).audio_codes[0]`` and ``decode``
equals ``EncodecModel.decode(codes[None], [None]).audio_values``, bit for bit in float32 on the
CPU: the weight-norm pairs are folded with the very call torch's parametrization makes at forward,
convolutions are padded as upstream pads them (its float32 frame count included) and the
quantizer's distance is upstream's expression in upstream's order.
"""

from __future__ import annotations

import math
from typing import Any, cast

import attrs
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.nn.seanet import (
    LSTM,
    ConvTranspose1d,
    NormConv1d,
    ResnetBlock,
    StreamState,
    fold_weight_norm_like_torch,
    step_layers,
    warmup_frames,
)
from mizuoto_runtime.weights.loading import load_into
from mizuoto_sdk.errors import EngineUnavailable

__all__ = ["EncodecCodec", "EncodecFrames", "EncodecStreamDecoder", "build"]

_CODEBOOK_STATS = ("*.codebook.inited", "*.codebook.cluster_size", "*.codebook.embed_avg")


class _Settings:
    """The config fields the forward reads, each with upstream's default."""

    def __init__(self, config: dict[str, Any]) -> None:
        norm = config.get("norm_type", "weight_norm")
        if norm not in ("weight_norm", "time_group_norm"):
            raise EngineUnavailable(f"encodec: config norm_type={norm!r} is not supported")
        self.group_norm = norm == "time_group_norm"
        self.channels = int(config.get("audio_channels", 1))
        self.hidden_size = int(config.get("hidden_size", 128))
        self.num_filters = int(config.get("num_filters", 32))
        self.residual_layers = int(config.get("num_residual_layers", 1))
        self.ratios = [int(r) for r in config.get("upsampling_ratios", (8, 5, 4, 2))]
        self.kernel_size = int(config.get("kernel_size", 7))
        self.last_kernel_size = int(config.get("last_kernel_size", 7))
        self.residual_kernel_size = int(config.get("residual_kernel_size", 3))
        self.dilation_growth = int(config.get("dilation_growth_rate", 2))
        self.causal = bool(config.get("use_causal_conv", True))
        self.pad_mode = str(config.get("pad_mode", "reflect"))
        self.compress = int(config.get("compress", 2))
        self.lstm_layers = int(config.get("num_lstm_layers", 2))
        self.trim_right_ratio = float(config.get("trim_right_ratio", 1.0))
        self.conv_shortcut = bool(config.get("use_conv_shortcut", True))
        self.codebook_size = int(config.get("codebook_size", 1024))
        self.codebook_dim = int(config.get("codebook_dim") or self.hidden_size)
        self.bandwidths = [float(b) for b in config.get("target_bandwidths", (1.5, 3, 6, 12, 24))]
        sampling_rate = int(config.get("sampling_rate", 24_000))
        self.frame_rate = math.ceil(sampling_rate / math.prod(self.ratios))
        self.bits = math.ceil(math.log2(self.codebook_size))
        if 2**self.bits != self.codebook_size:
            raise EngineUnavailable(f"encodec: codebook_size {self.codebook_size} is no power of 2")
        self.num_quantizers = int(1000 * self.bandwidths[-1] // (self.frame_rate * self.bits))
        self.normalize = bool(config.get("normalize", False))
        seconds, overlap = config.get("chunk_length_s"), config.get("overlap")
        self.chunk_length = None if seconds is None else int(seconds * sampling_rate)
        self.chunk_stride = self.chunk_length
        if self.chunk_length is not None:
            if overlap is None:
                raise EngineUnavailable(
                    "encodec: config chunk_length_s without overlap is not supported "
                    "(upstream then has no chunk stride)"
                )
            self.chunk_stride = max(1, int((1.0 - float(overlap)) * self.chunk_length))

    def conv(self, cin: int, cout: int, kernel: int, stride: int = 1) -> NormConv1d:
        return NormConv1d(
            cin,
            cout,
            kernel,
            stride=stride,
            causal=self.causal,
            pad_mode=self.pad_mode,
            group_norm=self.group_norm,
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
                group_norm=self.group_norm,
            )
            for j in range(self.residual_layers)
        ]


class _Encoder(nn.Module):
    def __init__(self, s: _Settings) -> None:
        super().__init__()
        layers: list[nn.Module] = [s.conv(s.channels, s.num_filters, s.kernel_size)]
        width = s.num_filters
        for ratio in reversed(s.ratios):
            layers += s.residuals(width)
            layers += [nn.ELU(), s.conv(width, width * 2, ratio * 2, stride=ratio)]
            width *= 2
        layers += [
            LSTM(width, s.lstm_layers),
            nn.ELU(),
            s.conv(width, s.hidden_size, s.last_kernel_size),
        ]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class _Decoder(nn.Module):
    def __init__(self, s: _Settings) -> None:
        super().__init__()
        width = s.num_filters * 2 ** len(s.ratios)
        layers: list[nn.Module] = [
            s.conv(s.hidden_size, width, s.kernel_size),
            LSTM(width, s.lstm_layers),
        ]
        for ratio in s.ratios:
            up = ConvTranspose1d(
                width,
                width // 2,
                ratio * 2,
                ratio,
                causal=s.causal,
                trim_right_ratio=s.trim_right_ratio,
                group_norm=s.group_norm,
            )
            layers += [nn.ELU(), up, *s.residuals(width // 2)]
            width //= 2
        layers += [nn.ELU(), s.conv(s.num_filters, s.channels, s.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.embed: Tensor = nn.Buffer(torch.empty(size, dim))

    def forward(self, x: Tensor) -> Tensor:
        """Nearest entry of each row of ``x`` [N, D], by upstream's expanded distance."""
        embed = self.embed.t()
        distance = -(
            x.pow(2).sum(1, keepdim=True) - 2 * x @ embed + embed.pow(2).sum(0, keepdim=True)
        )
        return distance.max(dim=-1).indices


class _Quantization(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.codebook: _Codebook = _Codebook(size, dim)


class _Quantizer(nn.Module):
    def __init__(self, s: _Settings) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [_Quantization(s.codebook_size, s.codebook_dim) for _ in range(s.num_quantizers)]
        )

    def codebook(self, k: int) -> _Codebook:
        return cast(_Quantization, self.layers[k]).codebook

    def encode(self, x: Tensor, count: int) -> Tensor:
        """[B, D, T] -> codes [B, count, T], each stage quantizing what the earlier left."""
        residual = x
        codes = []
        for k in range(min(count, len(self.layers))):
            codebook = self.codebook(k)
            rows = residual.permute(0, 2, 1)
            index = codebook(rows.reshape(-1, rows.shape[-1])).view(*rows.shape[:-1])
            residual = residual - F.embedding(index, codebook.embed).permute(0, 2, 1)
            codes.append(index)
        return torch.stack(codes, dim=1)

    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, K, T] -> the sum of the K entries [B, D, T], added in stage order."""
        total: Tensor | None = None
        for k in range(codes.shape[1]):
            entry = F.embedding(codes[:, k], self.codebook(k).embed).permute(0, 2, 1)
            total = entry if total is None else total + entry
        assert total is not None  # codes were checked to hold one stage at least
        return total


class EncodecCodec:
    """Audio [B, C, T] <-> codes [B, K, frames]; ``handles`` lets the memory manager place it."""

    def __init__(
        self,
        settings: _Settings,
        encoder: _Encoder,
        decoder: _Decoder,
        quantizer: _Quantizer,
        device: str,
        dtype: torch.dtype,
        name: str = "encodec",
    ) -> None:
        self._settings = settings
        self.dtype = dtype
        self.encoder, self.decoder, self.quantizer = encoder, decoder, quantizer
        self.frame_rate = settings.frame_rate
        self.hop_length = math.prod(settings.ratios)
        self.channels = settings.channels
        self.codebook_size = settings.codebook_size
        self.handles = (
            ModelHandle(
                encoder, name=f"{name}:encoder", load_device=device, units=_weighted(encoder)
            ),
            ModelHandle(
                decoder, name=f"{name}:decoder", load_device=device, units=_weighted(decoder)
            ),
            ModelHandle(quantizer, name=f"{name}:quantizer", load_device=device, units=()),
        )

    def quantizers_for(self, bandwidth: float | None) -> int:
        """Stages used at ``bandwidth`` (kbps); None is the first target bandwidth, as upstream."""
        s = self._settings
        if bandwidth is None:
            bandwidth = s.bandwidths[0]
        if bandwidth not in s.bandwidths:
            raise ValueError(f"bandwidth: expected one of {s.bandwidths}, got {bandwidth!r}")
        if bandwidth <= 0:
            return s.num_quantizers
        return int(
            max(1, math.floor(bandwidth * 1000 / (math.log2(s.codebook_size) * s.frame_rate)))
        )

    @torch.inference_mode()
    def encode(self, audio: Tensor, bandwidth: float | None = None) -> Tensor:
        """audio [B, C, T] (C = ``audio_channels``) -> codes [B, K, ceil(T / hop_length)].

        For checkpoints that code in chunks or rescale the audio (``chunk_length_s``,
        ``normalize``), codes alone do not decode: use ``encode_frames``.
        """
        if self._settings.chunk_length is not None or self._settings.normalize:
            raise ValueError(
                "encode: this checkpoint codes in chunks or rescales the audio "
                "(chunk_length_s / normalize); use encode_frames and decode_frames"
            )
        return self.encode_frames(audio, bandwidth).codes[0]

    @torch.inference_mode()
    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, K, frames] (or upstream's [1, B, K, frames]) -> audio [B, C, frames * hop]."""
        return self.decoder(self.quantizer.decode(self._checked(codes)))

    @torch.inference_mode()
    def encode_frames(self, audio: Tensor, bandwidth: float | None = None) -> EncodecFrames:
        """Upstream's whole ``EncodecModel.encode`` output: codes [chunks, B, K, frames], each
        chunk's scale (None unless ``normalize``) and the padding of the last chunk's codes."""
        if audio.dim() != 3 or audio.shape[1] != self.channels:
            raise ValueError(
                f"audio: expected [batch, {self.channels}, samples], got {list(audio.shape)}"
            )
        s = self._settings
        count = self.quantizers_for(bandwidth)
        audio = audio.to(self.dtype)
        length = audio.shape[-1]
        size, stride = (
            (length, length) if s.chunk_length is None else (s.chunk_length, s.chunk_stride)
        )
        chunks, scales = [], []
        for offset in range(0, length, max(1, stride or 1)):
            chunk = audio[..., offset : offset + size]
            scale = None
            if s.normalize:  # upstream's RMS of the channel mean, plus 1e-8
                mono = torch.sum(chunk, 1, keepdim=True) / chunk.shape[1]
                scale = mono.pow(2).mean(dim=-1, keepdim=True).sqrt() + 1e-8
                chunk = chunk / scale
                scale = scale.view(-1, 1)
            chunks.append(self.quantizer.encode(self.encoder(chunk), count))
            scales.append(scale)
        pad = chunks[0].shape[-1] - chunks[-1].shape[-1]
        if pad > 0:
            chunks[-1] = F.pad(chunks[-1], (0, pad), value=0)
        return EncodecFrames(torch.stack(chunks), tuple(scales), pad)

    @torch.inference_mode()
    def decode_frames(self, frames: EncodecFrames) -> Tensor:
        """Upstream's ``EncodecModel.decode(codes, scales, last_frame_pad_length=...)``: each
        chunk decoded and rescaled, chunks joined by upstream's linear overlap-add."""
        s, codes = self._settings, frames.codes
        if codes.dim() != 4 or len(frames.scales) != codes.shape[0]:
            raise ValueError(
                f"frames: expected codes [chunks, batch, K, frames] and one scale per chunk, "
                f"got {list(codes.shape)} and {len(frames.scales)} scales"
            )
        if s.chunk_length is None and codes.shape[0] != 1:
            raise ValueError(f"frames: expected one chunk, got {codes.shape[0]}")
        decoded = []
        for index, (chunk, scale) in enumerate(zip(codes, frames.scales, strict=True)):
            if index == len(codes) - 1 and frames.last_frame_pad_length > 0:
                chunk = chunk[..., : -frames.last_frame_pad_length]
            audio = self.decoder(self.quantizer.decode(self._checked(chunk)))
            decoded.append(audio if scale is None else audio * scale.view(-1, 1, 1))
        if s.chunk_length is None:
            return decoded[0]
        return _overlap_add(decoded, s.chunk_stride or 1)

    def stream_decoder(self) -> EncodecStreamDecoder:
        """A decoder for consecutive chunks of one code sequence (causal weight-norm configs)."""
        s = self._settings
        if s.chunk_length is not None or s.normalize:
            raise EngineUnavailable(
                "encodec: streaming a chunked or normalised checkpoint (chunk_length_s, "
                "normalize) is not supported"
            )
        if not s.causal or s.group_norm or s.trim_right_ratio != 1.0 or s.pad_mode == "circular":
            raise EngineUnavailable(
                "encodec: streaming needs use_causal_conv=True, norm_type='weight_norm', "
                "trim_right_ratio=1.0 and a pad_mode other than 'circular' (time_group_norm "
                f"normalises over the whole signal); this config has use_causal_conv={s.causal}, "
                f"group norm={s.group_norm}, trim_right_ratio={s.trim_right_ratio}, "
                f"pad_mode={s.pad_mode!r}"
            )
        return EncodecStreamDecoder(self)

    def _checked(self, codes: Tensor) -> Tensor:
        if codes.dim() == 4 and codes.shape[0] == 1:
            codes = codes[0]
        if codes.dim() != 3 or not 1 <= codes.shape[1] <= self._settings.num_quantizers:
            raise ValueError(
                f"codes: expected [batch, 1..{self._settings.num_quantizers}, frames], "
                f"got {list(codes.shape)}"
            )
        if codes.dtype.is_floating_point or codes.dtype == torch.bool:
            raise ValueError(f"codes: expected integer codes, got {codes.dtype}")
        if bool(((codes < 0) | (codes >= self.codebook_size)).any()):
            raise ValueError(
                f"codes: expected values in [0, {self.codebook_size}), got out of range"
            )
        return codes


class EncodecStreamDecoder:
    """Decodes one code sequence chunk by chunk, carrying the convs' and the LSTM's state.

    The first ``warmup`` frames are held back (``decode`` returns no samples until they arrived),
    so the first padded conv pads them as the whole decode pads the signal's start. The chunks'
    audio joined equals ``decode`` of the joined codes within float rounding.
    """

    def __init__(self, codec: EncodecCodec) -> None:
        self._codec = codec
        self._state: StreamState = {}
        self._held: Tensor | None = None
        self.warmup = warmup_frames(codec.decoder.layers)

    @torch.inference_mode()
    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, K, n] -> audio [B, C, n * hop] of those frames (held frames included)."""
        codes = self._codec._checked(codes)
        if self._held is not None:
            codes = torch.cat([self._held, codes], dim=-1)
            self._held = None
        if not self._state and codes.shape[-1] < self.warmup:
            self._held = codes
            return codes.new_zeros(
                (codes.shape[0], self._codec.channels, 0), dtype=self._codec.dtype
            )
        latents = self._codec.quantizer.decode(codes)
        return step_layers(self._codec.decoder.layers, latents, self._state)


@attrs.frozen
class EncodecFrames:
    """What upstream's ``EncodecModel.encode`` returns: codes [chunks, B, K, frames], each
    chunk's scale [B, 1] (None unless the checkpoint normalises), and how many code frames pad
    the last chunk."""

    codes: Tensor
    scales: tuple[Tensor | None, ...]
    last_frame_pad_length: int


def _overlap_add(frames: list[Tensor], stride: int) -> Tensor:
    """Upstream's ``_linear_overlap_add``: triangular weights peaking mid-chunk, normalised."""
    first = frames[0]
    total = stride * (len(frames) - 1) + frames[-1].shape[-1]
    steps = torch.linspace(0, 1, first.shape[-1] + 2, device=first.device, dtype=first.dtype)
    weight = 0.5 - (steps[1:-1] - 0.5).abs()
    weights = torch.zeros(total, device=first.device, dtype=first.dtype)
    out = torch.zeros(*first.shape[:-1], total, device=first.device, dtype=first.dtype)
    for index, frame in enumerate(frames):
        start, length = index * stride, frame.shape[-1]
        out[..., start : start + length] += weight[:length] * frame
        weights[start : start + length] += weight[:length]
    if weights.min() == 0:
        raise ValueError("frames: the chunks leave a gap (overlap-add weight zero)")
    return out / weights


def _weighted(module: nn.Module) -> list[nn.Module]:
    """The blocks of ``module.layers`` that hold weights: the units a handle may stream."""
    layers = cast(nn.ModuleList, module.get_submodule("layers"))
    return [layer for layer in layers if any(True for _ in layer.parameters())]


def build(
    config: dict[str, Any],
    state_dict: dict[str, Tensor],
    *,
    device: str,
    dtype: torch.dtype,
    name: str = "encodec",
) -> EncodecCodec:
    """An ``EncodecCodec`` from a transformers EnCodec config and state dict; its handles are
    named ``NAME:encoder``, ``NAME:decoder`` and ``NAME:quantizer``."""
    settings = _Settings(config)
    with torch.device("meta"):
        encoder = _Encoder(settings).to(dtype)
        decoder = _Decoder(settings).to(dtype)
        quantizer = _Quantizer(settings).to(dtype)
    weights = fold_weight_norm_like_torch(state_dict, dtype)
    for name, module in (("encoder.", encoder), ("decoder.", decoder), ("quantizer.", quantizer)):
        part = {k[len(name) :]: v.to(device) for k, v in weights.items() if k.startswith(name)}
        load_into(module, part, ignore=_CODEBOOK_STATS)
    stray = [k for k in weights if not k.startswith(("encoder.", "decoder.", "quantizer."))]
    if stray:
        raise EngineUnavailable(f"encodec: unexpected checkpoint keys: {', '.join(stray[:10])}")
    return EncodecCodec(settings, encoder, decoder, quantizer, device, dtype, name)
