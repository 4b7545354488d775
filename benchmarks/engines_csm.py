"""The csm engine, as a user runs it (the SDK's host API in-process), against transformers'
CsmForConditionalGeneration.generate in the same run, on one mid-size random checkpoint.

The checkpoint is written by the package's ``make_weights.write`` with larger sizes (a 6-layer
backbone of 512, a 4-layer depth decoder of 256, 16 codebooks of 256 codes, a Mimi of width 128)
and pointed at with the setting ``engines.csm.model_dir``. Rows:

- ``whole``: ``chunk_frames=0`` against ``generate(output_audio=True, max_new_tokens=F)``, the
  same audio (``same`` says whether it was bitwise equal); the ratio is transformers' time over
  ours (above 1.0x we are faster).
- ``first chunk``: ``chunk_frames=N``; the time to the first chunk against the time
  transformers' generate takes for N frames (codes only, no audio): the goal is at most 1.2x.

Calls alternate, so both meet the same machine load; the best of ``--repeats`` is printed.

    python benchmarks/engines_csm.py [--frames 24] [--chunk 6] [--repeats 2] [--threads N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

MID = {
    "model": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    },
    "depth_decoder": {
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "codec": {
        "hidden_size": 128,
        "num_filters": 16,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "num_quantizers": 16,
        "codebook_size": 256,
        "codebook_dim": 64,
        "vector_quantization_hidden_dimension": 64,
        "upsample_groups": 128,
    },
}
TEXT = "The quick brown fox jumps over the lazy dog."
SEED = 5


def theirs(model: Any, inputs: Any, frames: int, audio: bool) -> tuple[torch.Tensor | None, float]:
    with torch.random.fork_rng(), torch.inference_mode():
        torch.manual_seed(SEED)  # allowed: inside fork_rng (upstream uses the global one)
        start = time.perf_counter()
        out = model.generate(**inputs, max_new_tokens=frames, output_audio=audio)
        seconds = time.perf_counter() - start
    return (out[0] if audio else None), seconds


def ours(handle: Any, frames: int, chunk: int) -> tuple[np.ndarray, float, float]:
    from mizuoto_sdk.host import EngineRequest

    request = EngineRequest(params={"seed": SEED, "max_frames": frames, "chunk_frames": chunk})
    start = time.perf_counter()
    chunks: list[np.ndarray] = []
    first = 0.0
    for piece in handle.synthesize(TEXT, request):
        if not chunks:
            first = time.perf_counter() - start
        chunks.append(piece.samples)
    return np.concatenate(chunks), first, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=24, help="frames to write (F)")
    parser.add_argument("--chunk", type=int, default=6, help="frames per streamed chunk (N)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import CsmForConditionalGeneration, CsmProcessor

    from mizuoto_engine_csm.make_weights import write
    from mizuoto_sdk.host import RuntimeService

    with tempfile.TemporaryDirectory() as tmp:
        folder = write(Path(tmp) / "mid", MID)
        model = CsmForConditionalGeneration.from_pretrained(folder).eval()
        processor = CsmProcessor.from_pretrained(folder)
        conversation: Any = [{"role": "0", "content": [{"type": "text", "text": TEXT}]}]
        inputs = processor.apply_chat_template(conversation, tokenize=True, return_dict=True)
        service = RuntimeService({"engines.csm.model_dir": str(folder)})
        handle = service.load("csm", dtype="float32")
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"checkpoint: {params:.1f}M parameters (transformers' count, codec included)")
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU, float32")
        print(f"{args.frames} frames, chunks of {args.chunk}\n")
        ours(handle, 2, 0)  # first calls pay for lazy imports and allocations on both sides
        theirs(model, inputs, 2, True)

        best = {"ours": np.inf, "theirs": np.inf, "first": np.inf, "theirs_n": np.inf}
        same = True
        for _ in range(args.repeats):
            audio, _, total = ours(handle, args.frames, 0)
            reference, seconds = theirs(model, inputs, args.frames, True)
            _, first, _ = ours(handle, args.frames, args.chunk)
            _, seconds_n = theirs(model, inputs, args.chunk, False)
            same = same and reference is not None and np.array_equal(audio, reference.numpy())
            for key, value in (
                ("ours", total),
                ("theirs", seconds),
                ("first", first),
                ("theirs_n", seconds_n),
            ):
                best[key] = min(best[key], value)
        print(
            f"whole        ours {best['ours']:7.2f} s  transformers {best['theirs']:7.2f} s  "
            f"speed ratio {best['theirs'] / best['ours']:.2f}x (goal >= 1.0x)  same audio: {same}"
        )
        print(
            f"first chunk  ours {best['first'] * 1e3:7.0f} ms  transformers' {args.chunk} frames "
            f"{best['theirs_n'] * 1e3:7.0f} ms  ratio {best['first'] / best['theirs_n']:.2f}x "
            "(goal <= 1.2x)"
        )


if __name__ == "__main__":
    main()
