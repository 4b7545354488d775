"""Parity harness: run a ``save_pretrained`` Qwen2/Qwen3/Llama directory through CausalDecoder.

    python -m mizuoto_runtime.lm.parity --model-dir DIR --input-ids 1,2,3 --json \\
        [--dtype float32|bfloat16] [--max-new-tokens N] [--kv-cache dynamic|static] \\
        [--do-sample --seed S --temperature T --top-k K --top-p P --min-p M] \\
        [--repetition-penalty R --min-new-tokens N --eos-token-id E] \\
        [--logits-out F.npy] [--step-logits-out F.npy]

prints the generated token ids (and what ran) as JSON. The numbers are meant to equal
transformers' bit for bit: ``--logits-out`` saves ``model(input_ids).logits[0]`` [seq, vocab] as
float32, ``--step-logits-out`` the raw logits of each generated step [steps, vocab], as
``generate(output_logits=True)`` returns them, and sampling draws from a private generator seeded
``S``, which yields transformers' ``generate(do_sample=True)`` tokens after
``torch.manual_seed(S)``. Settings a flag leaves unset come from the directory's
``generation_config.json``, then from generate's defaults, as transformers takes them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.lm.config import UnsupportedModel
from mizuoto_runtime.lm.decoder import CausalDecoder
from mizuoto_runtime.lm.generate import generate
from mizuoto_runtime.sampling import InvalidSamplingParams, SamplingParams
from mizuoto_runtime.weights.loading import CheckpointError, LoadError

__all__ = ["main", "run"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_FROM_GENERATION_CONFIG = (
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "min_new_tokens",
    "eos_token_id",
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mizuoto_runtime.lm.parity",
        description=(
            "Run a transformers Qwen2/Qwen3/Llama save_pretrained directory through CausalDecoder."
        ),
    )
    parser.add_argument("--model-dir", required=True, type=Path)
    parser.add_argument("--input-ids", required=True, help="comma-separated prompt token ids")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--kv-cache", choices=("dynamic", "static"), default="dynamic")
    parser.add_argument("--do-sample", action="store_true", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--min-p", type=float)
    parser.add_argument("--repetition-penalty", type=float)
    parser.add_argument("--min-new-tokens", type=int)
    parser.add_argument("--eos-token-id", type=int, action="append")
    parser.add_argument("--pad-token-id", type=int)
    parser.add_argument("--logits-out", type=Path, help="save the prompt's logits [seq, vocab]")
    parser.add_argument("--step-logits-out", type=Path, help="save each step's logits")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def _generation_config(model_dir: Path) -> dict[str, object]:
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def _sampling(args: argparse.Namespace, defaults: dict[str, object]) -> SamplingParams:
    chosen = {
        key: defaults[key] for key in _FROM_GENERATION_CONFIG if defaults.get(key) is not None
    }
    flags = {
        "do_sample": args.do_sample,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "min_new_tokens": args.min_new_tokens,
        "eos_token_id": args.eos_token_id,
    }
    chosen.update({key: value for key, value in flags.items() if value is not None})
    return SamplingParams(**chosen)  # type: ignore[arg-type]  # JSON and flag values; its validators check each


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Load, run and save what ``args`` ask for; returns the JSON-ready result."""
    ids = [int(token) for token in args.input_ids.split(",") if token.strip()]
    if not ids:
        raise ValueError("--input-ids: expected at least one token id, e.g. 1,2,3")
    defaults = _generation_config(args.model_dir)
    params = _sampling(args, defaults)
    pad = args.pad_token_id if args.pad_token_id is not None else defaults.get("pad_token_id")
    device = torch.device(args.device)
    decoder = CausalDecoder.from_pretrained(args.model_dir, dtype=DTYPES[args.dtype], device=device)
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    ctx = RequestContext(seed=args.seed, settings={"compute.kv_cache": args.kv_cache})
    with ctx.bind(), torch.inference_mode():
        if args.logits_out is not None:
            logits = decoder(input_ids)[0].to(torch.float32)  # [seq, vocab]
            np.save(args.logits_out, logits.cpu().numpy())
        result = generate(
            decoder,
            input_ids,
            params,
            max_new_tokens=args.max_new_tokens,
            generator=torch.Generator(device).manual_seed(args.seed),
            pad_token_id=pad if isinstance(pad, int) else None,
            output_logits=args.step_logits_out is not None,
        )
    if args.step_logits_out is not None:
        assert result.logits is not None
        np.save(args.step_logits_out, result.logits[:, 0].cpu().numpy())  # [steps, vocab]
    return {
        "model_type": decoder.config.model_type,
        "dtype": args.dtype,
        "input_ids": ids,
        "tokens": result.new_tokens[0].tolist(),
        "sequence": result.tokens[0].tolist(),
        "kv_cache": args.kv_cache,
        "seed": args.seed,
        "sampling": {
            "do_sample": params.do_sample,
            "temperature": params.temperature,
            "top_k": params.top_k,
            "top_p": params.top_p,
            "min_p": params.min_p,
            "repetition_penalty": params.repetition_penalty,
            "min_new_tokens": params.min_new_tokens,
            "eos_token_id": list(params.eos_token_id),
        },
        "applied": {key: value for key, value in ctx.applied.items() if key != "seed"},
        "logits_out": None if args.logits_out is None else str(args.logits_out),
        "step_logits_out": None if args.step_logits_out is None else str(args.step_logits_out),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        result = run(args)
    except (
        UnsupportedModel,
        CheckpointError,
        LoadError,
        InvalidSamplingParams,
        ValueError,
    ) as error:
        if args.json:
            print(json.dumps({"error": type(error).__name__, "message": str(error)}))
        else:
            print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        print(" ".join(map(str, result["tokens"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
