"""The architecture of a Qwen2, Qwen3 or Llama checkpoint, read from its config.json as transformers
reads it.

transformers 5.24 fills in defaults in ways that change the numbers: Qwen3's ``head_dim`` defaults
to 128 (not hidden_size // heads, which Qwen2 and Llama use), ``rope_scaling`` (4.x) and
``rope_parameters`` (5.x) are the same field, ``rope_theta`` may sit beside them, and yarn's and
llama3's ``original_max_position_embeddings`` default to ``max_position_embeddings``. The families
differ only in which projections carry a bias and in Qwen3's per-head q/k norms, so one frozen
value describes all three; anything CausalDecoder cannot compute exactly as upstream does is an
``UnsupportedModel`` naming the field, raised before a tensor is allocated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from os import PathLike
from pathlib import Path

import attrs

from mizuoto_sdk.errors import EngineUnavailable

__all__ = ["FAMILIES", "DecoderConfig", "QwenConfig", "RopeParameters", "UnsupportedModel"]

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


@attrs.frozen
class _Family:
    """What a family's config class defaults to where config.json is silent."""

    vocab_size: int
    intermediate_size: int
    max_position_embeddings: int
    head_dim: int | None  # None: hidden_size // num_attention_heads
    eos_token_id: int | None


FAMILIES: Mapping[str, _Family] = {
    "qwen2": _Family(151936, 22016, 32768, None, None),
    "qwen3": _Family(151936, 22016, 32768, 128, None),
    "llama": _Family(32000, 11008, 2048, None, 2),
}
"""The ``model_type`` values CausalDecoder reproduces, with their config classes' defaults."""


class UnsupportedModel(EngineUnavailable, ValueError):
    """A config that CausalDecoder cannot reproduce bit for bit; ``field`` names what is wrong.

    The model, not the request, is at fault: the host reports ``engine_unavailable`` with the
    config key in ``detail["key"]``; ``ValueError`` stays a base for library code.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(
            f"{field}: {problem}", {"reason": "unsupported_model_config", "key": field}
        )
        self.field = field
        self.problem = problem


@attrs.frozen(kw_only=True)
class RopeParameters:
    """transformers' standardized ``rope_parameters`` for one model (all layers share them)."""

    rope_type: str = "default"
    rope_theta: float = 10000.0
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    low_freq_factor: float | None = None  # llama3
    high_freq_factor: float | None = None  # llama3


@attrs.frozen(kw_only=True)
class DecoderConfig:
    """One Qwen2, Qwen3 or Llama decoder, with transformers' field names and resolved defaults.

    The family shows in three switches: ``qkv_bias`` / ``o_bias`` (Qwen2: q/k/v only; Qwen3 and
    Llama: all four when ``attention_bias``), ``mlp_bias`` (Llama's ``mlp_bias``) and ``qk_norm``
    (Qwen3's per-head RMSNorm on queries and keys).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    qkv_bias: bool = True
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    rope: RopeParameters = RopeParameters()
    pad_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()

    @property
    def groups(self) -> int:
        """Query heads per key/value head (1: no GQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, raw: Mapping[str, object]) -> DecoderConfig:
        """Resolve a config.json mapping as ``Qwen2Config`` / ``Qwen3Config`` / ``LlamaConfig``
        (5.24) would; also a sub-config (a dict with ``model_type`` set to a family)."""
        family = raw.get("model_type")
        if not isinstance(family, str) or family not in FAMILIES:
            raise UnsupportedModel(
                "model_type", f"expected one of {', '.join(FAMILIES)}, got {family!r}"
            )
        defaults = FAMILIES[family]
        hidden = _int(raw, "hidden_size", 4096)
        heads = _int(raw, "num_attention_heads", 32)
        kv_heads = raw.get("num_key_value_heads")
        kv_heads = heads if kv_heads is None else _int(raw, "num_key_value_heads", heads)
        if heads % kv_heads:
            raise UnsupportedModel(
                "num_key_value_heads", f"{kv_heads} does not divide num_attention_heads={heads}"
            )
        head_dim = raw.get("head_dim")
        if head_dim is None:
            head_dim = defaults.head_dim or hidden // heads
        if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0:
            raise UnsupportedModel("head_dim", f"expected an integer > 0, got {head_dim!r}")
        activation = raw.get("hidden_act", "silu")
        if activation != "silu":
            raise UnsupportedModel("hidden_act", f"only 'silu' is implemented, got {activation!r}")
        _check_full_attention(raw)
        bias = bool(raw.get("attention_bias", False))
        eos = raw.get("eos_token_id", defaults.eos_token_id)
        longest = _int(raw, "max_position_embeddings", defaults.max_position_embeddings)
        return cls(
            model_type=family,
            vocab_size=_int(raw, "vocab_size", defaults.vocab_size),
            hidden_size=hidden,
            intermediate_size=_int(raw, "intermediate_size", defaults.intermediate_size),
            num_hidden_layers=_int(raw, "num_hidden_layers", 32),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),  # type: ignore[arg-type]
            max_position_embeddings=longest,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=True if family == "qwen2" else bias,
            o_bias=False if family == "qwen2" else bias,
            mlp_bias=family == "llama" and bool(raw.get("mlp_bias", False)),
            qk_norm=family == "qwen3",
            rope=_rope_parameters(raw, head_dim, longest),
            pad_token_id=raw.get("pad_token_id"),  # type: ignore[arg-type]
            eos_token_id=() if eos is None else tuple(eos) if isinstance(eos, list) else (eos,),  # type: ignore[arg-type]
        )

    @classmethod
    def from_pretrained(cls, model_dir: str | PathLike[str]) -> DecoderConfig:
        """Read ``config.json`` from a directory written by ``save_pretrained``."""
        path = Path(model_dir) / "config.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise UnsupportedModel("config.json", f"cannot read {path}: {error}") from error
        return cls.from_dict(raw)


QwenConfig = DecoderConfig
"""The name engines built on Qwen use; the same class."""


def _int(raw: Mapping[str, object], field: str, default: int) -> int:
    value = raw.get(field, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UnsupportedModel(field, f"expected an integer > 0, got {value!r}")
    return value


def _check_full_attention(raw: Mapping[str, object]) -> None:
    layer_types = raw.get("layer_types") or ()
    sliding = raw.get("use_sliding_window", False) or "sliding_attention" in layer_types  # type: ignore[operator]
    if sliding:
        raise UnsupportedModel(
            "use_sliding_window", "sliding-window layers are not implemented; full attention only"
        )


def _number(params: Mapping[str, object], key: str, rope_type: str) -> float:
    value = params.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise UnsupportedModel(
            f"rope_parameters.{key}", f"{rope_type} RoPE needs a number, got {value!r}"
        )
    return float(value)


def _rope_parameters(raw: Mapping[str, object], head_dim: int, longest: int) -> RopeParameters:
    # convert_rope_params_to_dict + standardize_rope_params, for a flat (one-for-all) dict.
    found = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    if not isinstance(found, Mapping):
        raise UnsupportedModel("rope_parameters", f"expected a mapping, got {found!r}")
    params = dict(found)
    if "full_attention" in params:  # nested by layer type; every layer here is full attention
        params = dict(params["full_attention"] or {})
    params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    if raw.get("partial_rotary_factor") is not None:
        params.setdefault("partial_rotary_factor", raw["partial_rotary_factor"])
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise UnsupportedModel(
            "rope_parameters.rope_type",
            f"{rope_type!r} is not implemented; expected one of {', '.join(ROPE_TYPES)}",
        )
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedModel(
            "rope_parameters.partial_rotary_factor",
            "these decoders rotate the whole head; partial rotary factors are not implemented",
        )
    if rope_type in ("linear", "dynamic", "llama3"):
        _number(params, "factor", rope_type)
    low = high = None
    if rope_type == "llama3":
        low = _number(params, "low_freq_factor", rope_type)
        high = _number(params, "high_freq_factor", rope_type)
    original = None
    if rope_type in ("yarn", "llama3"):  # a top-level value wins, as upstream's Phi3 exception
        original = raw.get("original_max_position_embeddings")
        if original is None:
            original = params.get("original_max_position_embeddings", longest)
    if head_dim % 2:
        raise UnsupportedModel("head_dim", f"RoPE needs an even head_dim, got {head_dim}")
    factor = params.get("factor")
    return RopeParameters(
        rope_type=rope_type,
        rope_theta=float(params["rope_theta"]),
        factor=None if factor is None else float(factor),
        original_max_position_embeddings=original,  # type: ignore[arg-type]
        attention_factor=params.get("attention_factor"),
        beta_fast=params.get("beta_fast"),
        beta_slow=params.get("beta_slow"),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        truncate=bool(params.get("truncate", True)),
        low_freq_factor=low,
        high_freq_factor=high,
    )
