"""Language-model decoders with transformers' numerics: Qwen2, Qwen3 and Llama, caches, masks,
decoding. ``QwenDecoder`` / ``QwenConfig`` are the same classes as ``CausalDecoder`` /
``DecoderConfig``, under the names engines built on Qwen use."""

from mizuoto_runtime.lm.attention import QWEN_SDPA, hf_sdpa
from mizuoto_runtime.lm.cache import BufferCache, CacheFull, DynamicCache
from mizuoto_runtime.lm.config import DecoderConfig, QwenConfig, RopeParameters, UnsupportedModel
from mizuoto_runtime.lm.decoder import CausalDecoder, QwenDecoder
from mizuoto_runtime.lm.decoding import Step, decode
from mizuoto_runtime.lm.generate import Generation, generate
from mizuoto_runtime.lm.mask import mask_for

__all__ = [
    "QWEN_SDPA",
    "BufferCache",
    "CacheFull",
    "CausalDecoder",
    "DecoderConfig",
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
