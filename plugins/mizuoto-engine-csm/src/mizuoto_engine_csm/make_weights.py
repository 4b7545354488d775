"""Make the shipped tiny checkpoint: ``python -m mizuoto_engine_csm.make_weights [--out DIR]``.

A small random ``CsmForConditionalGeneration`` (a 2-layer Llama backbone with llama3 RoPE, a
2-layer depth decoder, a Mimi codec with 4 quantizers of 64 codes and the real codec's kernel and
stride layout, so that the processor's frame count formula holds) saved with transformers'
``save_pretrained``, beside a processor folder: a byte-level BPE tokenizer without merges that
holds CSM's four special tokens, a 24 kHz feature extractor and the chat template CSM's
processor renders. The folder is laid out as the Hub's sesame/csm-1b is, so the engine reads
both the same way. transformers is needed here only (a dev dependency); the engine never
imports it. The weights are drawn from a generator with a fixed seed (never the global one), so
the files are reproducible on one torch version (a test checks them).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
SEED = 20251207  # of the generator every weight is drawn from

BOS, EOS, AUDIO, AUDIO_EOS = "<|begin_of_text|>", "<|end_of_text|>", "<|AUDIO|>", "<|audio_eos|>"
SPECIAL_TOKENS = (BOS, EOS, AUDIO, AUDIO_EOS)  # ids 256..259, after the 256 byte tokens

# The turns CSM conditions on: every turn but the last carries one text and one audio, the last
# one text (its audio is what the model writes). Renders
# <|begin_of_text|>[speaker]text<|end_of_text|> per turn, then <|AUDIO|><|audio_eos|> for audio.
CHAT_TEMPLATE = (
    "{%- for turn in messages -%}"
    "{%- set kinds = turn['content'] | map(attribute='type') | list -%}"
    "{%- if turn['role'] is not string or not turn['role'].isdigit() -%}"
    "{{- raise_exception('a role is the speaker id as a string of digits, e.g. \"0\"') -}}"
    "{%- endif -%}"
    "{%- if kinds | reject('in', ['text', 'audio']) | list -%}"
    "{{- raise_exception('content items are text or audio') -}}"
    "{%- endif -%}"
    "{%- if loop.last -%}"
    "{%- if kinds.count('text') != 1 or kinds.count('audio') > 1 -%}"
    "{{- raise_exception('the last turn holds one text and at most one audio') -}}"
    "{%- endif -%}"
    "{%- elif kinds.count('text') != 1 or kinds.count('audio') != 1 -%}"
    "{{- raise_exception('every turn before the last holds one text and one audio') -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- for turn in messages -%}"
    "{{- bos_token + '[' + turn['role'] + ']' + turn['content'][0]['text'] + eos_token -}}"
    "{%- if turn['content'] | length > 1 -%}{{- '<|AUDIO|><|audio_eos|>' -}}{%- endif -%}"
    "{%- endfor -%}"
)

CODEC: dict[str, Any] = {
    "sampling_rate": 24_000,
    "frame_rate": 12.5,
    "hidden_size": 32,
    "num_filters": 4,
    "upsampling_ratios": [8, 6, 5, 4],
    "codebook_size": 64,  # the whole code vocabulary: a random model's every code decodes
    "codebook_dim": 16,
    "vector_quantization_hidden_dimension": 16,
    "num_quantizers": 4,
    "num_semantic_quantizers": 1,
    "upsample_groups": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 48,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "sliding_window": 250,
}


def llama3_rope(original: int) -> dict[str, Any]:
    """csm-1b's RoPE (llama3, theta 5e5) with a short original context, so that the tiny
    models' few positions fall in all three of its frequency bands."""
    return {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": original,
    }


# csm-1b has 2051 ids per codebook over Mimi's 2048 codes; here the two are equal, so that the
# untrained model's every code is one the codec decodes. 0 is the end frame's code.
CODEBOOK_VOCAB = CODEC["codebook_size"]
MODEL: dict[str, Any] = {
    "num_codebooks": CODEC["num_quantizers"],
    "vocab_size": CODEBOOK_VOCAB,
    "text_vocab_size": 256 + len(SPECIAL_TOKENS),
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rope_parameters": llama3_rope(1024),
    "bos_token_id": 256,
    "pad_token_id": 258,
    "audio_token_id": 258,
    "audio_eos_token_id": 259,
    "codebook_pad_token_id": CODEBOOK_VOCAB - 1,
    "codebook_eos_token_id": 0,
}
DEPTH_DECODER: dict[str, Any] = {
    "num_codebooks": CODEC["num_quantizers"],
    "backbone_hidden_size": MODEL["hidden_size"],
    "vocab_size": CODEBOOK_VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": CODEC["num_quantizers"] + 1,
    "rope_parameters": llama3_rope(8),
}
# As sesame/csm-1b ships them: both models sample, top_k 50, temperature 0.9.
GENERATION: dict[str, Any] = {"do_sample": True, "top_k": 50, "temperature": 0.9}
MAX_NEW_TOKENS = 12  # csm-1b: 125 (10 s); 12 frames are about 1 s


def byte_tokens() -> dict[str, int]:
    """The 256 byte-level symbols (GPT-2's byte-to-unicode map), in byte order."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return {symbols[byte]: byte for byte in range(256)}


def make_tokenizer() -> Any:
    """A transformers fast tokenizer: one token per UTF-8 byte, CSM's specials after them."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(vocab=byte_tokens(), merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(token, special=True) for token in SPECIAL_TOKENS])
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 256)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=EOS
    )


def make_model(overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Any:
    """The random CsmForConditionalGeneration, its generation configs as the Hub's.

    transformers initialises from the global generator, so the model is built inside
    ``fork_rng`` (which puts that generator back) and every drawn tensor is then drawn again from
    a generator of its own, seeded ``SEED``: the files depend on that seed only. Constant tensors
    (norm weights of one, layer scales) are kept as built.
    """
    import torch
    from transformers import (
        CsmConfig,
        CsmDepthDecoderConfig,
        CsmForConditionalGeneration,
        GenerationConfig,
        MimiConfig,
    )

    changes = overrides or {}
    codec = {**CODEC, **changes.get("codec", {})}
    codebooks, vocab = codec["num_quantizers"], codec["codebook_size"]
    sizes = {"num_codebooks": codebooks, "vocab_size": vocab}
    model_fields = {
        **MODEL,
        **sizes,
        "codebook_pad_token_id": vocab - 1,
        **changes.get("model", {}),
    }
    depth = {
        **DEPTH_DECODER,
        **sizes,
        "backbone_hidden_size": model_fields["hidden_size"],
        "max_position_embeddings": codebooks + 1,
        **changes.get("depth_decoder", {}),
    }
    config = CsmConfig(
        **model_fields,
        depth_decoder_config=CsmDepthDecoderConfig(**depth).to_dict(),
        codec_config=MimiConfig(**codec).to_dict(),
    )
    with torch.random.fork_rng():
        model = CsmForConditionalGeneration(config).eval()
    generator = torch.Generator().manual_seed(SEED)
    seen: set[int] = set()
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            if id(tensor) in seen or not tensor.is_floating_point():
                continue
            seen.add(id(tensor))
            if name.endswith("cluster_usage"):  # upstream starts codebooks silent: spread them
                tensor.uniform_(0.5, 2.0, generator=generator)
            elif name.endswith("embed_sum"):
                tensor.normal_(generator=generator)
            elif tensor.numel() > 1 and bool((tensor == tensor.flatten()[0]).all()):
                continue  # a constant: ones, zeros, a layer scale
            else:
                fan_in = tensor[0].numel() if tensor.dim() > 1 else 50
                tensor.normal_(0.0, fan_in**-0.5, generator=generator)
    # Fresh configs, not ones derived from the model config: those carry
    # "_from_model_config": true, which makes from_pretrained drop the depth_decoder_* keys.
    model.generation_config = GenerationConfig(**GENERATION, max_new_tokens=MAX_NEW_TOKENS)
    model.depth_decoder.generation_config = GenerationConfig(**GENERATION)
    return model


def write(out_dir: str | Path, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Path:
    """Write the checkpoint and processor folder into ``out_dir``; returns the folder.

    ``overrides`` changes the sizes (``{"model": {...}, "depth_decoder": {...}, "codec":
    {...}}``, transformers' config fields; the codebook count and size follow the codec's), for
    benchmarks on larger random checkpoints."""
    from transformers import CsmProcessor, EncodecFeatureExtractor

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    extractor = EncodecFeatureExtractor(feature_size=1, sampling_rate=CODEC["sampling_rate"])
    processor = CsmProcessor(extractor, make_tokenizer(), chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(out)
    make_model(overrides).save_pretrained(out)
    for name in ("config.json", "generation_config.json"):  # stable bytes: sorted keys
        path = out / name
        path.write_text(json.dumps(json.loads(path.read_text()), indent=2, sort_keys=True) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mizuoto_engine_csm.make_weights", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=WEIGHTS_DIR, help="folder to write into")
    args = parser.parse_args(argv)
    out = write(args.out)
    size = sum(path.stat().st_size for path in out.iterdir() if path.is_file())
    print(f"wrote {out} ({size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
