"""wav2vec 2.0, HuBERT and WavLM: raw audio [B, T] -> every hidden state, as transformers 5.24.

``build`` makes a ``SpeechEncoder`` whose call returns what ``Wav2Vec2Model`` / ``HubertModel`` /
``WavLMModel`` return as ``hidden_states`` (``output_hidden_states=True``, eval): the input of the
first transformer layer, then each layer's output. The module tree keeps upstream's parameter
names, so a checkpoint loads unchanged (a task model's ``wav2vec2.`` / ``hubert.`` / ``wavlm.``
prefix is taken off and its heads left out).

Bit for bit with upstream comes from doing upstream's operations in upstream's order: the
positional conv's weight is ``torch._weight_norm(v, g, 2)`` at every call, as torch's weight-norm
parametrization computes it; wav2vec 2.0 and HuBERT attention is the SDPA call transformers' sdpa
integration makes (the ``accel`` site's reference), with its boolean padding mask; WavLM's is in
``wavlm.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_runtime.accel import Site, attention
from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.nn.wav2vec2_config import SpeechEncoderConfig
from mizuoto_runtime.nn.wavlm import WavLMAttention
from mizuoto_runtime.ops import default
from mizuoto_runtime.weights.loading import load_into, replace_prefixes, strip_prefix

__all__ = ["SITE", "SpeechEncoder", "Wav2Vec2Encoder", "build"]

SITE = Site(
    "wav2vec2.self_attention",
    upstream="transformers 5.24 sdpa_attention_forward (Wav2Vec2Attention, HubertAttention)",
)


def _gelu_new(x: Tensor) -> Tensor:
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


# transformers' ACT2FN entries, computed as they compute them
_ACTIVATIONS: Mapping[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": _gelu_new,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}


class _ConvLayer(nn.Module):
    """One feature-extractor conv: conv, then a group norm, a layer norm over channels, or none."""

    def __init__(self, config: SpeechEncoderConfig, index: int, norm: str | None) -> None:
        super().__init__()
        channels = config.conv_dim[index]
        self.conv = default.Conv1d(
            config.conv_dim[index - 1] if index > 0 else 1,
            channels,
            kernel_size=config.conv_kernel[index],
            stride=config.conv_stride[index],
            bias=config.conv_bias,
        )
        self.norm = norm
        self.layer_norm: nn.Module | None = None
        if norm == "group":  # one group per channel, eps 1e-5, as upstream
            self.layer_norm = default.GroupNorm(channels, channels, affine=True)
        elif norm == "layer":
            self.layer_norm = default.LayerNorm(channels, elementwise_affine=True)
        self.activation = _ACTIVATIONS[config.feat_extract_activation]

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv(x)
        if self.layer_norm is not None:
            if self.norm == "layer":
                x = self.layer_norm(x.transpose(-2, -1)).transpose(-2, -1)
            else:
                x = self.layer_norm(x)
        return self.activation(x)


class _FeatureEncoder(nn.Module):
    def __init__(self, config: SpeechEncoderConfig) -> None:
        super().__init__()
        count = len(config.conv_dim)
        norms: list[str | None] = ["layer"] * count
        if config.feat_extract_norm == "group":  # only the first conv is normed
            norms = ["group"] + [None] * (count - 1)
        self.conv_layers = nn.ModuleList(_ConvLayer(config, i, n) for i, n in enumerate(norms))

    def forward(self, audio: Tensor) -> Tensor:
        x = audio[:, None]  # [B, 1, T]
        for layer in self.conv_layers:
            x = layer(x)
        return x  # [B, C, frames]


class _FeatureProjection(nn.Module):
    def __init__(self, config: SpeechEncoderConfig) -> None:
        super().__init__()
        self.layer_norm = (
            default.LayerNorm(config.conv_dim[-1], eps=config.layer_norm_eps)
            if config.feat_proj_layer_norm
            else None
        )
        self.projection = default.Linear(config.conv_dim[-1], config.hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.projection(x if self.layer_norm is None else self.layer_norm(x))


class _WeightPair(nn.Module):
    """Where torch's weight-norm parametrization keeps g (``original0``) and v (``original1``)."""

    def __init__(self, g_shape: tuple[int, ...], v_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.original0 = nn.Parameter(torch.empty(g_shape))
        self.original1 = nn.Parameter(torch.empty(v_shape))


class _WeightNormConv1d(nn.Module):
    """A grouped conv whose weight is ``g * v / ||v||`` over dims 0 and 1, made at every call."""

    def __init__(self, channels: int, kernel: int, groups: int) -> None:
        super().__init__()
        self.groups, self.padding = groups, kernel // 2
        pair = _WeightPair((1, 1, kernel), (channels, channels // groups, kernel))
        self.parametrizations = nn.ModuleDict({"weight": pair})
        self.bias = nn.Parameter(torch.empty(channels))

    def forward(self, x: Tensor) -> Tensor:
        pair = cast(_WeightPair, self.parametrizations["weight"])
        weight = torch._weight_norm(pair.original1, pair.original0, 2)  # as the parametrization
        return F.conv1d(x, weight, self.bias, 1, self.padding, 1, self.groups)


class _PositionalConv(nn.Module):
    """The convolutional relative position embedding added to the projected features."""

    def __init__(self, config: SpeechEncoderConfig) -> None:
        super().__init__()
        width, kernel = config.hidden_size, config.num_conv_pos_embeddings
        groups = config.num_conv_pos_embedding_groups
        self.conv: nn.Module
        # HuBERT's batch-norm variant has a plain conv; torch.nn's BatchNorm1d draws nothing,
        # and on meta it allocates nothing.
        self.batch_norm = nn.BatchNorm1d(width) if config.conv_pos_batch_norm else None
        if config.conv_pos_batch_norm:
            self.conv = default.Conv1d(width, width, kernel, padding=kernel // 2, groups=groups)
        else:
            self.conv = _WeightNormConv1d(width, kernel, groups)
        self.trim = 1 if kernel % 2 == 0 else 0  # an even kernel makes one frame too many
        self.activation = _ACTIVATIONS[config.feat_extract_activation]

    def forward(self, x: Tensor) -> Tensor:
        x = x.transpose(1, 2)
        if self.batch_norm is not None:
            x = self.batch_norm(x)
        x = self.conv(x)
        if self.trim:
            x = x[:, :, : -self.trim]
        return self.activation(x).transpose(1, 2)


class _Attention(nn.Module):
    """wav2vec 2.0 / HuBERT self-attention through the ``accel`` site."""

    def __init__(self, config: SpeechEncoderConfig) -> None:
        super().__init__()
        width = config.hidden_size
        self.head_dim = config.head_dim
        self.k_proj = default.Linear(width, width)
        self.v_proj = default.Linear(width, width)
        self.q_proj = default.Linear(width, width)
        self.out_proj = default.Linear(width, width)

    def forward(
        self, x: Tensor, valid: Tensor | None, position_bias: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        batch, length, _ = x.shape
        shape = (batch, length, -1, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)  # [B, H, T, D]
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        mask = None
        if valid is not None:  # transformers' [B, 1, T, T] boolean padding mask
            mask = valid[:, None, None, :].expand(batch, 1, length, length).contiguous()
        out = attention(q, k, v, site=SITE, mask=mask, scale=self.head_dim**-0.5)
        out = out.transpose(1, 2).contiguous().reshape(batch, length, -1).contiguous()
        return self.out_proj(out), position_bias


class _FeedForward(nn.Module):
    def __init__(self, config: SpeechEncoderConfig) -> None:
        super().__init__()
        self.intermediate_dense = default.Linear(config.hidden_size, config.intermediate_size)
        self.output_dense = default.Linear(config.intermediate_size, config.hidden_size)
        self.activation = _ACTIVATIONS[config.hidden_act]

    def forward(self, x: Tensor) -> Tensor:
        return self.output_dense(self.activation(self.intermediate_dense(x)))


class _AttentionAdapter(nn.Module):
    """The small bottleneck a pre-norm layer adds at its end (MMS's per-language adapters)."""

    def __init__(self, width: int, bottleneck: int) -> None:
        super().__init__()
        self.norm = default.LayerNorm(width)  # eps 1e-5, not the config's, as upstream
        self.linear_1 = default.Linear(width, bottleneck)
        self.linear_2 = default.Linear(bottleneck, width)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(F.relu(self.linear_1(self.norm(x))))


class _EncoderLayer(nn.Module):
    """A transformer layer, post-norm or (``do_stable_layer_norm``) pre-norm."""

    def __init__(self, config: SpeechEncoderConfig, index: int) -> None:
        super().__init__()
        self.attention: nn.Module
        if config.family == "wavlm":
            self.attention = WavLMAttention(config, has_relative_position_bias=index == 0)
        else:
            self.attention = _Attention(config)
        width, eps = config.hidden_size, config.layer_norm_eps
        self.layer_norm = default.LayerNorm(width, eps=eps)
        self.feed_forward = _FeedForward(config)
        self.final_layer_norm = default.LayerNorm(width, eps=eps)
        self.pre_norm = config.do_stable_layer_norm
        self.adapter_layer = None
        if config.adapter_attn_dim is not None:
            self.adapter_layer = _AttentionAdapter(width, config.adapter_attn_dim)

    def forward(
        self, x: Tensor, valid: Tensor | None, position_bias: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        if self.pre_norm:
            attended, position_bias = self.attention(self.layer_norm(x), valid, position_bias)
            x = x + attended
            x = x + self.feed_forward(self.final_layer_norm(x))
            if self.adapter_layer is not None:
                x = x + self.adapter_layer(x)
            return x, position_bias
        attended, position_bias = self.attention(x, valid, position_bias)
        x = self.layer_norm(x + attended)
        return self.final_layer_norm(x + self.feed_forward(x)), position_bias


class _Encoder(nn.Module):
    def __init__(self, config: SpeechEncoderConfig) -> None:
        super().__init__()
        self.pos_conv_embed = _PositionalConv(config)
        self.layer_norm = default.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(
            _EncoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.pre_norm = config.do_stable_layer_norm
        self.sdpa_mask = config.family != "wavlm"

    def forward(self, x: Tensor, valid: Tensor | None) -> list[Tensor]:
        if valid is not None:  # padded frames are zero before the positional conv
            x = x.masked_fill(~valid[..., None], 0)
            if self.sdpa_mask and bool(valid.all()):
                valid = None  # transformers then passes SDPA no mask at all
        x = x + self.pos_conv_embed(x)
        if not self.pre_norm:
            x = self.layer_norm(x)
        states = [x]
        position_bias = None  # WavLM's first layer makes it, the others reuse it
        for layer in self.layers:
            x, position_bias = layer(x, valid, position_bias)
            states.append(x)
        return states


class Wav2Vec2Encoder(nn.Module):
    """The weights and forward of one wav2vec 2.0 / HuBERT / WavLM base model (eval only)."""

    def __init__(self, config: SpeechEncoderConfig) -> None:
        super().__init__()
        self.config = config
        if config.has_masked_spec_embed:  # training's mask vector, stored by every checkpoint
            self.masked_spec_embed = nn.Parameter(torch.empty(config.hidden_size))
        self.feature_extractor = _FeatureEncoder(config)
        self.feature_projection = _FeatureProjection(config)
        self.encoder = _Encoder(config)

    def forward(self, audio: Tensor, valid: Tensor | None) -> tuple[Tensor, ...]:
        features = self.feature_extractor(audio).transpose(1, 2)  # [B, frames, C]
        return tuple(self.encoder(self.feature_projection(features), valid))

    def frames(self, samples: Tensor) -> Tensor:
        """Frames the feature extractor makes of ``samples`` samples (upstream's formula)."""
        for kernel, stride in zip(self.config.conv_kernel, self.config.conv_stride, strict=True):
            samples = torch.div(samples - kernel, stride, rounding_mode="floor") + 1
        return samples


class SpeechEncoder:
    """A loaded speech encoder: ``encoder(audio [B, T]) -> hidden states``, each [B, frames, C].

    The weights live in ``handles[0]`` (the transformer layers are its streamable units), so the
    memory manager may place or stream them; the call reads the module through the handle.
    """

    def __init__(self, config: SpeechEncoderConfig, handle: ModelHandle) -> None:
        self.config = config
        self.handles: tuple[ModelHandle, ...] = (handle,)

    @property
    def module(self) -> Wav2Vec2Encoder:
        module = self.handles[0].module
        assert isinstance(module, Wav2Vec2Encoder)
        return module

    def __call__(self, audio: Tensor, attention_mask: Tensor | None = None) -> tuple[Tensor, ...]:
        """Every hidden state of ``audio`` [B, T] (samples at the checkpoint's rate).

        ``attention_mask`` [B, T] marks real samples with 1 and right padding with 0, as
        upstream takes it: padded frames are zeroed and never attended to.
        """
        module = self.module
        if not isinstance(audio, Tensor) or audio.dim() != 2 or not audio.is_floating_point():
            raise ValueError(
                f"audio: expected a float tensor [batch, samples], got {_shape(audio)}"
            )
        device, dtype = self.handles[0].load_device, module.feature_projection.projection.bias.dtype
        audio = audio.to(device=device, dtype=dtype)
        need = self._shortest()
        if audio.shape[1] < need:
            raise ValueError(
                f"audio: {audio.shape[1]} samples are too few; this encoder needs at least {need}"
            )
        valid = None
        if attention_mask is not None:
            valid = self._frame_mask(attention_mask, audio.shape, need)
        return module(audio, valid)

    def last_hidden_state(self, hidden_states: tuple[Tensor, ...]) -> Tensor:
        """Upstream's ``last_hidden_state``: the last state, after the final norm of pre-norm
        (``do_stable_layer_norm``) encoders."""
        if not self.config.do_stable_layer_norm:
            return hidden_states[-1]
        return self.module.encoder.layer_norm(hidden_states[-1])

    def _shortest(self) -> int:
        samples = 1
        for kernel, stride in zip(
            reversed(self.config.conv_kernel), reversed(self.config.conv_stride), strict=True
        ):
            samples = (samples - 1) * stride + kernel
        return samples

    def _frame_mask(self, attention_mask: Tensor, shape: torch.Size, need: int) -> Tensor:
        if not isinstance(attention_mask, Tensor) or attention_mask.shape != shape:
            raise ValueError(
                f"attention_mask: expected [batch, samples] = {list(shape)} of 0 and 1, "
                f"got {_shape(attention_mask)}"
            )
        lengths = attention_mask.to(self.handles[0].load_device).long().sum(-1)
        if bool((lengths < need).any()):
            raise ValueError(
                f"attention_mask: every row needs at least {need} real samples, got "
                f"{lengths.tolist()}"
            )
        frames = int(self.module.frames(torch.tensor(shape[1])))
        positions = torch.arange(frames, device=lengths.device)
        return positions[None, :] < self.module.frames(lengths)[:, None]


def _shape(value: object) -> str:
    if isinstance(value, Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return type(value).__name__


def _own_keys(state_dict: Mapping[str, Tensor], family: str) -> dict[str, Tensor]:
    """The base model's keys: a task model's prefix stripped, old weight-norm names renamed."""
    prefix = family + "."
    if any(key.startswith(prefix) for key in state_dict):
        state_dict = strip_prefix(state_dict, prefix)
    conv = "encoder.pos_conv_embed.conv."
    return replace_prefixes(
        state_dict,
        {
            conv + "weight_g": conv + "parametrizations.weight.original0",
            conv + "weight_v": conv + "parametrizations.weight.original1",
        },
    )


def build(
    config: Mapping[str, Any],
    state_dict: Mapping[str, Tensor],
    *,
    device: str,
    dtype: torch.dtype,
    name: str | None = None,
) -> SpeechEncoder:
    """A ``SpeechEncoder`` from a parsed ``config.json`` and its checkpoint's tensors; its handle
    is named ``NAME:encoder`` (NAME defaults to the family).

    Built on ``meta`` (nothing allocated or drawn), filled strictly: a missing, extra or
    mis-shaped key is a ``LoadError`` listing them all. Tensors already in ``dtype`` on
    ``device`` become the weights as they are (a mapped file stays mapped).
    """
    parsed = SpeechEncoderConfig.from_dict(config)
    with torch.device("meta"):
        module = Wav2Vec2Encoder(parsed).to(dtype=dtype)
    load_into(module, _own_keys(state_dict, parsed.family), cast=True)
    module = module.to(device).eval().requires_grad_(False)
    handle = ModelHandle(
        module,
        name=f"{name or parsed.family}:encoder",
        load_device=device,
        units=tuple(module.encoder.layers),
    )
    return SpeechEncoder(parsed, handle)
