"""Language-model decoders with transformers' numerics: Qwen2 / Qwen3, caches, masks, decoding."""

from mizuoto_runtime.lm.attention import QWEN_SDPA, hf_sdpa
from mizuoto_runtime.lm.cache import BufferCache, CacheFull, DynamicCache
from mizuoto_runtime.lm.config import QwenConfig, RopeParameters, UnsupportedModel
from mizuoto_runtime.lm.decoder import QwenDecoder
from mizuoto_runtime.lm.decoding import Step, decode
from mizuoto_runtime.lm.generate import Generation, generate
from mizuoto_runtime.lm.mask import mask_for

__all__ = [
    "QWEN_SDPA",
    "BufferCache",
    "CacheFull",
    "DynamicCache",
    "Generation",
    "QwenConfig",
    "QwenDecoder",
    "RopeParameters",
    "Step",
    "UnsupportedModel",
    "decode",
    "generate",
    "hf_sdpa",
    "mask_for",
]
