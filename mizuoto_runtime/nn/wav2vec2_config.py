"""The fields of a wav2vec 2.0 / HuBERT / WavLM ``config.json`` that change the encoder's forward.

Read once, validated in one place: a field this runtime does not build (an adapter, an activation
it does not know) is ``EngineUnavailable`` naming it, never silently ignored. Fields a Hub config
may lack take transformers' defaults for that family.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NoReturn

import attrs

from mizuoto_sdk.errors import EngineUnavailable

__all__ = ["ACTIVATIONS", "FAMILIES", "SpeechEncoderConfig"]

Family = Literal["wav2vec2", "hubert", "wavlm"]
FAMILIES: tuple[Family, ...] = ("wav2vec2", "hubert", "wavlm")

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")
"""transformers' ``ACT2FN`` names the encoder computes (``nn/wav2vec2.py`` says how)."""

# transformers 5.24's defaults (Wav2Vec2Config, HubertConfig and WavLMConfig agree on these)
_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-5,
    "feat_extract_norm": "group",
    "feat_extract_activation": "gelu",
    "conv_dim": [512] * 7,
    "conv_stride": [5, 2, 2, 2, 2, 2, 2],
    "conv_kernel": [10, 3, 3, 3, 3, 2, 2],
    "conv_bias": False,
    "num_conv_pos_embeddings": 128,
    "num_conv_pos_embedding_groups": 16,
    "do_stable_layer_norm": False,
    "mask_time_prob": 0.05,
    "mask_feature_prob": 0.0,
    "feat_proj_layer_norm": True,
    "conv_pos_batch_norm": False,
    "num_buckets": 320,
    "max_bucket_distance": 800,
    "add_adapter": False,
    "adapter_attn_dim": None,
}


@attrs.frozen
class SpeechEncoderConfig:
    """What the encoder's shape and arithmetic depend on, for one checkpoint."""

    family: Family
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str
    layer_norm_eps: float
    feat_extract_norm: Literal["group", "layer"]
    feat_extract_activation: str
    conv_dim: tuple[int, ...]
    conv_kernel: tuple[int, ...]
    conv_stride: tuple[int, ...]
    conv_bias: bool
    num_conv_pos_embeddings: int
    num_conv_pos_embedding_groups: int
    do_stable_layer_norm: bool
    has_masked_spec_embed: bool  # a learnt mask vector is stored (unused in eval)
    feat_proj_layer_norm: bool  # HuBERT may drop the projection's norm; the others keep it
    conv_pos_batch_norm: bool  # HuBERT may batch-norm before a plain positional conv
    num_buckets: int  # WavLM's relative positions
    max_bucket_distance: int
    adapter_attn_dim: int | None  # pre-norm wav2vec 2.0 / HuBERT layers' adapters (MMS)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> SpeechEncoderConfig:
        """Validate ``config`` (a parsed ``config.json``); every problem names its field."""
        family = config.get("model_type")
        if family not in FAMILIES:
            raise EngineUnavailable(
                f"model_type {family!r} is not a speech encoder family; "
                f"known: {', '.join(FAMILIES)}"
            )

        def get(name: str) -> Any:
            return config.get(name, _DEFAULTS[name])

        if family != "hubert" and get("add_adapter"):
            _refuse("add_adapter", True, "the adapter after the encoder is not built")
        for name in ("hidden_act", "feat_extract_activation"):
            if get(name) not in ACTIVATIONS:
                _refuse(name, get(name), f"known activations: {', '.join(ACTIVATIONS)}")
        if get("feat_extract_norm") not in ("group", "layer"):
            _refuse("feat_extract_norm", get("feat_extract_norm"), "expected 'group' or 'layer'")
        convs = {
            n: tuple(int(x) for x in get(n)) for n in ("conv_dim", "conv_kernel", "conv_stride")
        }
        if len({len(v) for v in convs.values()}) != 1 or not convs["conv_dim"]:
            _refuse(
                "conv_dim", convs, "conv_dim, conv_kernel and conv_stride need one equal length"
            )
        layers = config.get("num_feat_extract_layers", len(convs["conv_dim"]))
        if layers != len(convs["conv_dim"]):
            _refuse("num_feat_extract_layers", layers, f"conv_dim has {len(convs['conv_dim'])}")
        hidden, heads = int(get("hidden_size")), int(get("num_attention_heads"))
        if heads < 1 or hidden % heads:
            _refuse("num_attention_heads", heads, f"must divide hidden_size {hidden}")
        groups = int(get("num_conv_pos_embedding_groups"))
        if groups < 1 or hidden % groups:
            _refuse("num_conv_pos_embedding_groups", groups, f"must divide hidden_size {hidden}")
        hubert = family == "hubert"
        stable = bool(get("do_stable_layer_norm"))
        adapter = get("adapter_attn_dim")
        if adapter is not None and (not isinstance(adapter, int) or adapter < 1):
            _refuse("adapter_attn_dim", adapter, "expected a positive width or null")
        return cls(
            family=family,
            hidden_size=hidden,
            num_hidden_layers=int(get("num_hidden_layers")),
            num_attention_heads=heads,
            intermediate_size=int(get("intermediate_size")),
            hidden_act=get("hidden_act"),
            layer_norm_eps=float(get("layer_norm_eps")),
            feat_extract_norm=get("feat_extract_norm"),
            feat_extract_activation=get("feat_extract_activation"),
            conv_dim=convs["conv_dim"],
            conv_kernel=convs["conv_kernel"],
            conv_stride=convs["conv_stride"],
            conv_bias=bool(get("conv_bias")),
            num_conv_pos_embeddings=int(get("num_conv_pos_embeddings")),
            num_conv_pos_embedding_groups=groups,
            do_stable_layer_norm=stable,
            has_masked_spec_embed=get("mask_time_prob") > 0.0 or get("mask_feature_prob") > 0.0,
            feat_proj_layer_norm=bool(get("feat_proj_layer_norm")) if hubert else True,
            conv_pos_batch_norm=bool(get("conv_pos_batch_norm")) if hubert else False,
            num_buckets=int(get("num_buckets")),
            max_bucket_distance=int(get("max_bucket_distance")),
            adapter_attn_dim=adapter if family != "wavlm" and stable else None,
        )


def _refuse(field: str, value: object, why: str) -> NoReturn:
    raise EngineUnavailable(f"speech encoder config: {field}={value!r} is not supported: {why}")
