"""A CSM folder's config.json and generation_config.json, read as transformers 5.24 reads them.

``CsmConfig`` fills defaults that change the numbers (rms_norm_eps 1e-5, RoPE theta 5e5), so a
missing key here gets CSM's default, not Llama's, before the two Llama configs are resolved by
``mizuoto_runtime.lm.DecoderConfig``. The generation settings follow ``from_pretrained``: the
``depth_decoder_*`` keys are the depth decoder's own, unless the file says
``"_from_model_config": true``, in which case upstream drops them and the depth decoder decodes
greedily. Every malformed value is ``EngineUnavailable`` naming its file and key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from mizuoto_runtime.lm import DecoderConfig, UnsupportedModel
from mizuoto_sdk.errors import EngineUnavailable

CONFIG_FILE = "config.json"
GENERATION_FILE = "generation_config.json"
DEPTH_PREFIX = "depth_decoder_"

# CsmConfig / CsmDepthDecoderConfig defaults (transformers 5.24) for the keys a folder may omit.
_BACKBONE_DEFAULTS: dict[str, Any] = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_act": "silu",
}
_DEPTH_DEFAULTS: dict[str, Any] = {
    **_BACKBONE_DEFAULTS,
    "hidden_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 33,
}
_CSM_THETA = 500000.0
_DECODER_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "attention_bias",
    "mlp_bias",
    "hidden_act",
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
)
# generate's processors this port does not apply: refused unless at their neutral value.
_NEUTRAL: dict[str, object] = {
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "num_beams": 1,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "top_h": None,
    "min_new_tokens": None,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "guidance_scale": None,
    "renormalize_logits": False,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None,
    "penalty_alpha": None,
}


@attrs.frozen(kw_only=True)
class Sampling:
    """One model's sampling settings, as its GenerationConfig holds them (upstream defaults)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    min_p: float | None = None


@attrs.frozen(kw_only=True)
class CsmConfig:
    """What the engine needs of a CSM checkpoint folder."""

    num_codebooks: int
    codebook_vocab: int  # ids per codebook (CsmConfig.vocab_size)
    text_vocab_size: int
    audio_token_id: int
    audio_eos_token_id: int
    codebook_eos_token_id: int
    codebook_pad_token_id: int | None
    backbone: DecoderConfig
    depth: DecoderConfig
    codec: dict[str, Any]
    sampling: Sampling
    depth_sampling: Sampling
    max_new_tokens: int

    @classmethod
    def from_folder(cls, folder: Path) -> CsmConfig:
        raw = _read(folder / CONFIG_FILE)
        generation = _read(folder / GENERATION_FILE)
        where = f"{folder / CONFIG_FILE}"
        if raw.get("model_type") != "csm":
            raise EngineUnavailable(
                f"{where}: model_type must be 'csm', got {raw.get('model_type')!r}"
            )
        depth_raw = raw.get("depth_decoder_config")
        codec = raw.get("codec_config")
        if not isinstance(depth_raw, dict) or not isinstance(codec, dict):
            raise EngineUnavailable(
                f"{where}: depth_decoder_config and codec_config must be objects (a CSM config "
                "as save_pretrained writes it)"
            )
        if codec.get("model_type") != "mimi":
            raise EngineUnavailable(
                f"{where}: codec_config.model_type must be 'mimi', got {codec.get('model_type')!r}"
            )
        codebooks = _count(raw, "num_codebooks", 32, where)
        vocab = _count(raw, "vocab_size", 2051, where)
        backbone = _decoder(raw, _BACKBONE_DEFAULTS, vocab, where, "")
        depth = _decoder(depth_raw, _DEPTH_DEFAULTS, vocab, where, "depth_decoder_config.")
        if _count(depth_raw, "num_codebooks", 32, where) != codebooks:
            raise EngineUnavailable(
                f"{where}: depth_decoder_config.num_codebooks must equal num_codebooks "
                f"({codebooks})"
            )
        if _count(depth_raw, "backbone_hidden_size", 2048, where) != backbone.hidden_size:
            raise EngineUnavailable(
                f"{where}: depth_decoder_config.backbone_hidden_size must equal hidden_size "
                f"({backbone.hidden_size})"
            )
        if codec.get("num_quantizers", 32) != codebooks:
            raise EngineUnavailable(
                f"{where}: codec_config.num_quantizers must equal num_codebooks ({codebooks}); "
                "every frame is decoded from all its codes"
            )
        sampling, depth_sampling, max_new = _generation(
            generation, folder / GENERATION_FILE, codebooks
        )
        return cls(
            num_codebooks=codebooks,
            codebook_vocab=vocab,
            text_vocab_size=_count(raw, "text_vocab_size", 128256, where),
            audio_token_id=_id(raw, "audio_token_id", 128002, where),
            audio_eos_token_id=_id(raw, "audio_eos_token_id", 128003, where),
            codebook_eos_token_id=_id(raw, "codebook_eos_token_id", 0, where),
            codebook_pad_token_id=raw.get("codebook_pad_token_id", 2050),
            backbone=backbone,
            depth=depth,
            codec=codec,
            sampling=sampling,
            depth_sampling=depth_sampling,
            max_new_tokens=max_new,
        )


def _read(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EngineUnavailable(
            f"{path}: missing (a CSM folder as save_pretrained writes it)"
        ) from None
    except (OSError, ValueError) as error:
        raise EngineUnavailable(f"{path}: not readable JSON ({error})") from None
    if not isinstance(value, dict):
        raise EngineUnavailable(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _count(raw: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise EngineUnavailable(f"{where}: {key} must be an integer > 0, got {value!r}")
    return value


def _id(raw: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = raw.get(key, default)
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise EngineUnavailable(
            f"{where}: {key} must be a token id (an integer >= 0), got {value!r}"
        )
    return value


def _decoder(
    raw: Mapping[str, Any], defaults: Mapping[str, Any], vocab: int, where: str, prefix: str
) -> DecoderConfig:
    """A Llama config for one of CSM's two decoders, CSM's defaults filled in first."""
    fields = {key: raw[key] for key in _DECODER_KEYS if raw.get(key) is not None}
    fields = {**defaults, **fields, "model_type": "llama", "vocab_size": vocab}
    if "rope_parameters" not in fields and "rope_scaling" not in fields:
        fields["rope_parameters"] = {"rope_type": "default"}
    rope = dict(fields.get("rope_parameters") or fields.get("rope_scaling") or {})
    rope.setdefault("rope_theta", fields.get("rope_theta", _CSM_THETA))
    fields["rope_parameters"] = rope
    fields.pop("rope_scaling", None)
    try:
        return DecoderConfig.from_dict(fields)
    except UnsupportedModel as error:
        raise EngineUnavailable(
            f"{where}: {prefix}{error}", {"key": prefix + error.field}
        ) from None


def _generation(
    raw: Mapping[str, Any], path: Path, codebooks: int
) -> tuple[Sampling, Sampling, int]:
    depth = {k[len(DEPTH_PREFIX) :]: v for k, v in raw.items() if k.startswith(DEPTH_PREFIX)}
    main = {k: v for k, v in raw.items() if not k.startswith(DEPTH_PREFIX)}
    if raw.get("_from_model_config") is True:  # from_pretrained then drops the depth keys
        depth = {}
    max_new = main.get("max_new_tokens")
    if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new <= 0:
        raise EngineUnavailable(
            f"{path}: max_new_tokens must be an integer > 0 (the default length), got {max_new!r}"
        )
    # generate() forces the depth decoder to write num_codebooks - 1 codes and saves that back
    lengths = {depth.pop(key, None) for key in ("min_new_tokens", "max_new_tokens")} - {None}
    if lengths - {codebooks - 1}:
        raise EngineUnavailable(
            f"{path}: depth_decoder_min_new_tokens and depth_decoder_max_new_tokens must be "
            f"num_codebooks - 1 ({codebooks - 1}) when given, got {sorted(lengths)}"
        )
    for name, settings in (("", main), (DEPTH_PREFIX, depth)):
        for key, neutral in _NEUTRAL.items():
            if settings.get(key, neutral) != neutral:
                raise EngineUnavailable(
                    f"{path}: {name}{key}={settings[key]!r} is a generate setting this engine "
                    f"does not apply; remove it or set it to {neutral!r}"
                )
    return _sampling(main, path, ""), _sampling(depth, path, DEPTH_PREFIX), max_new


def _sampling(raw: Mapping[str, Any], path: Path, prefix: str) -> Sampling:
    default = Sampling()
    fields: dict[str, Any] = {}
    for key, kind in (
        ("do_sample", bool),
        ("temperature", float),
        ("top_k", int),
        ("top_p", float),
    ):
        value = raw.get(key, getattr(default, key))
        if value is None:
            value = getattr(default, key)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if ok and kind is float:
            ok = math.isfinite(value) and value >= 0
        if ok and kind is int:
            ok = value >= 0
        if not ok:
            raise EngineUnavailable(
                f"{path}: {prefix}{key} must be a {kind.__name__}, got {value!r}"
            )
        fields[key] = value
    min_p = raw.get("min_p")
    if min_p is not None and not (isinstance(min_p, (int, float)) and 0 <= min_p <= 1):
        raise EngineUnavailable(f"{path}: {prefix}min_p must be in [0, 1], got {min_p!r}")
    return Sampling(**fields, min_p=None if min_p is None else float(min_p))
