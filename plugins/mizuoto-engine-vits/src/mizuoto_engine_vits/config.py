"""The fields of a ``vits`` config.json that shape the network or its forward, checked.

Field names and defaults are transformers' ``VitsConfig`` (5.x), so a folder as the Hub ships it
(MMS-TTS) or as ``save_pretrained`` writes it reads unchanged. Training-only fields (dropouts,
the posterior encoder's depth, ``spectrogram_bins``) are not read. A value this port cannot
honour is ``EngineUnavailable`` naming the field, before anything is built. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mizuoto_sdk.errors import EngineUnavailable

_DEFAULTS: dict[str, Any] = {
    "vocab_size": 38,
    "hidden_size": 192,
    "num_hidden_layers": 6,
    "num_attention_heads": 2,
    "window_size": 4,
    "use_bias": True,
    "ffn_dim": 768,
    "ffn_kernel_size": 3,
    "flow_size": 192,
    "hidden_act": "relu",
    "layer_norm_eps": 1e-5,
    "use_stochastic_duration_prediction": True,
    "num_speakers": 1,
    "speaker_embedding_size": 0,
    "upsample_initial_channel": 512,
    "upsample_rates": [8, 8, 2, 2],
    "upsample_kernel_sizes": [16, 16, 4, 4],
    "resblock_kernel_sizes": [3, 7, 11],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "leaky_relu_slope": 0.1,
    "depth_separable_channels": 2,
    "depth_separable_num_layers": 3,
    "duration_predictor_flow_bins": 10,
    "duration_predictor_tail_bound": 5.0,
    "duration_predictor_kernel_size": 3,
    "duration_predictor_num_flows": 4,
    "duration_predictor_filter_channels": 256,
    "prior_encoder_num_flows": 4,
    "prior_encoder_num_wavenet_layers": 4,
    "wavenet_kernel_size": 5,
    "wavenet_dilation_rate": 1,
    "speaking_rate": 1.0,
    "noise_scale": 0.667,
    "noise_scale_duration": 0.8,
    "sampling_rate": 16000,
}

ACTIVATIONS = ("relu", "gelu")
"""``hidden_act`` values this port runs (transformers' ``ACT2FN`` entries of the same names)."""


@dataclass(frozen=True)
class VitsConfig:
    """One checked ``vits`` config; see transformers' ``VitsConfig`` for each field's meaning."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    window_size: int
    use_bias: bool
    ffn_dim: int
    ffn_kernel_size: int
    flow_size: int
    hidden_act: str
    layer_norm_eps: float
    use_stochastic_duration_prediction: bool
    num_speakers: int
    speaker_embedding_size: int
    upsample_initial_channel: int
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    leaky_relu_slope: float
    depth_separable_channels: int
    depth_separable_num_layers: int
    duration_predictor_flow_bins: int
    duration_predictor_tail_bound: float
    duration_predictor_kernel_size: int
    duration_predictor_num_flows: int
    duration_predictor_filter_channels: int
    prior_encoder_num_flows: int
    prior_encoder_num_wavenet_layers: int
    wavenet_kernel_size: int
    wavenet_dilation_rate: int
    speaking_rate: float
    noise_scale: float
    noise_scale_duration: float
    sampling_rate: int

    @property
    def hop_length(self) -> int:
        """Waveform samples per latent frame."""
        return math.prod(self.upsample_rates)

    @property
    def speakers(self) -> int:
        """How many speaker ids a request may pick (1: the model has no speaker embedding)."""
        return self.num_speakers if self.num_speakers > 1 else 1

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> VitsConfig:
        """Upstream's defaults for absent fields; each value checked against what it must be."""
        if config.get("model_type", "vits") != "vits":
            raise EngineUnavailable(
                f"vits config: model_type: expected 'vits', got {config.get('model_type')!r}"
            )
        get = {**_DEFAULTS, **{k: v for k, v in config.items() if k in _DEFAULTS}}
        try:
            parsed = _parse(get)
        except ValueError as error:
            raise EngineUnavailable(f"vits config: {error}") from None
        _check_shapes(parsed)
        return parsed


def _parse(get: Mapping[str, Any]) -> VitsConfig:
    counts = {
        name: _int(get, name, 1)
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "window_size",
            "ffn_dim",
            "ffn_kernel_size",
            "flow_size",
            "num_speakers",
            "upsample_initial_channel",
            "depth_separable_num_layers",
            "duration_predictor_flow_bins",
            "duration_predictor_kernel_size",
            "duration_predictor_num_flows",
            "duration_predictor_filter_channels",
            "prior_encoder_num_flows",
            "prior_encoder_num_wavenet_layers",
            "wavenet_kernel_size",
            "wavenet_dilation_rate",
            "sampling_rate",
        )
    }
    return VitsConfig(
        **counts,
        use_bias=_bool(get, "use_bias"),
        hidden_act=_choice(get, "hidden_act", ACTIVATIONS),
        layer_norm_eps=_real(get, "layer_norm_eps", positive=True),
        use_stochastic_duration_prediction=_bool(get, "use_stochastic_duration_prediction"),
        speaker_embedding_size=_int(get, "speaker_embedding_size", 0),
        upsample_rates=_ints(get["upsample_rates"], "upsample_rates"),
        upsample_kernel_sizes=_ints(get["upsample_kernel_sizes"], "upsample_kernel_sizes"),
        resblock_kernel_sizes=_ints(get["resblock_kernel_sizes"], "resblock_kernel_sizes"),
        resblock_dilation_sizes=tuple(
            _ints(d, "resblock_dilation_sizes") for d in _list(get, "resblock_dilation_sizes")
        ),
        leaky_relu_slope=_real(get, "leaky_relu_slope"),
        depth_separable_channels=_int(get, "depth_separable_channels", 1),
        duration_predictor_tail_bound=_real(get, "duration_predictor_tail_bound", positive=True),
        speaking_rate=_real(get, "speaking_rate", positive=True),
        noise_scale=_real(get, "noise_scale"),
        noise_scale_duration=_real(get, "noise_scale_duration"),
    )


def _check_shapes(c: VitsConfig) -> None:
    """Combinations upstream builds but cannot run, refused at load rather than mid-request."""
    problems = []
    if c.hidden_size % c.num_attention_heads:
        problems.append(
            f"hidden_size {c.hidden_size} must be a multiple of num_attention_heads "
            f"{c.num_attention_heads}"
        )
    if c.flow_size % 2:
        problems.append(f"flow_size must be even (the flows split it in halves), got {c.flow_size}")
    if c.depth_separable_channels != 2:
        # The duration flows run on [log-duration, noise]: two channels, whatever the config says.
        problems.append(
            f"depth_separable_channels must be 2 (the duration flows' two channels), got "
            f"{c.depth_separable_channels}"
        )
    if c.num_speakers > 1 and c.speaker_embedding_size < 1:
        problems.append(
            f"num_speakers {c.num_speakers} needs speaker_embedding_size >= 1, got "
            f"{c.speaker_embedding_size}"
        )
    for a, b in (
        ("upsample_rates", "upsample_kernel_sizes"),
        ("resblock_kernel_sizes", "resblock_dilation_sizes"),
    ):
        if len(getattr(c, a)) != len(getattr(c, b)):
            problems.append(f"{a} and {b} must have one length")
    if any(k < r for k, r in zip(c.upsample_kernel_sizes, c.upsample_rates, strict=False)):
        problems.append("each of upsample_kernel_sizes must be at least its upsample_rates entry")
    if any(k % 2 == 0 for k in c.resblock_kernel_sizes):
        problems.append("resblock_kernel_sizes must be odd (the residual add keeps the length)")
    if c.upsample_initial_channel >> len(c.upsample_rates) < 1:
        problems.append(
            f"upsample_initial_channel {c.upsample_initial_channel} halves to no channel in "
            f"{len(c.upsample_rates)} upsampling stages"
        )
    if c.wavenet_kernel_size % 2 == 0:
        problems.append(f"wavenet_kernel_size must be odd, got {c.wavenet_kernel_size}")
    if problems:
        raise EngineUnavailable("vits config: " + "; ".join(problems))


def _int(config: Mapping[str, Any], name: str, least: int) -> int:
    value = config[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}: expected an integer >= {least}, got {value!r}")
    return value


def _ints(value: object, name: str) -> tuple[int, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ValueError(f"{name}: expected a non-empty list of positive integers, got {value!r}")
    return tuple(_int({name: v}, name, 1) for v in value)


def _list(config: Mapping[str, Any], name: str) -> Sequence[Any]:
    value = config[name]
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ValueError(f"{name}: expected a non-empty list, got {value!r}")
    return value


def _real(config: Mapping[str, Any], name: str, *, positive: bool = False) -> float:
    value = config[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{name}: expected a number > 0, got {value!r}")
    return float(value)


def _bool(config: Mapping[str, Any], name: str) -> bool:
    value = config[name]
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected true or false, got {value!r}")
    return value


def _choice(config: Mapping[str, Any], name: str, choices: tuple[str, ...]) -> str:
    value = config[name]
    if value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")
    return str(value)
