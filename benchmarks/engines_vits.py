"""The vits engine, as a user runs it (the SDK's host API in-process), against transformers'
VitsModel in the same run, on one mid-size random checkpoint.

The checkpoint is MMS-TTS's architecture (``VitsConfig()``: 6 encoder layers of 192, stochastic
durations, hop 256 at 16 kHz) with the decoder's first width halved (256; MMS has 512) and random
weights, written by the package's ``make_weights.write`` and pointed at with the setting
``engines.vits.model_dir``. Rows:

- ``sentence``: one sentence, so both sides give the same audio (``same`` says whether it was
  bitwise equal); real-time factor (audio seconds per compute second) and the ratio ours/theirs
  (above 1.0x we are faster).
- ``paragraph``: three sentences. The engine streams one chunk per sentence; transformers makes
  the whole waveform at once, so its first audio comes at the end. Rows give the first-chunk
  latency of each and the real-time factor of the whole.

Calls alternate, so both meet the same machine load; the best of ``--repeats`` is printed.

    python benchmarks/engines_vits.py [--repeats 3] [--threads N]
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
    "upsample_initial_channel": 256,
    "hidden_size": 192,
    "num_hidden_layers": 6,
    "ffn_dim": 768,
    "flow_size": 192,
    "spectrogram_bins": 513,
    "upsample_rates": [8, 8, 2, 2],
    "upsample_kernel_sizes": [16, 16, 4, 4],
    "resblock_kernel_sizes": [3, 7, 11],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "prior_encoder_num_flows": 4,
    "prior_encoder_num_wavenet_layers": 4,
    "posterior_encoder_num_wavenet_layers": 1,
    "duration_predictor_num_flows": 4,
    "duration_predictor_filter_channels": 256,
    "depth_separable_num_layers": 3,
}
SENTENCE = "The quick brown fox jumps over the lazy dog."
PARAGRAPH = (
    "The quick brown fox jumps over the lazy dog. A second sentence follows the first one, "
    "a little longer than it. And a short third!"
)
SEED = 5


def theirs(model: Any, tokenizer: Any, text: str) -> tuple[np.ndarray, float]:
    inputs = tokenizer(text, return_tensors="pt")
    with torch.random.fork_rng(), torch.inference_mode():
        torch.manual_seed(SEED)  # allowed: inside fork_rng (upstream uses the global one)
        start = time.perf_counter()
        wave = model(**inputs).waveform[0]
        return wave.numpy(), time.perf_counter() - start


def ours(handle: Any, text: str) -> tuple[np.ndarray, float, float]:
    from mizuoto_sdk.host import EngineRequest

    start = time.perf_counter()
    chunks: list[np.ndarray] = []
    first = 0.0
    for chunk in handle.synthesize(text, EngineRequest(params={"seed": SEED})):
        if not chunks:
            first = time.perf_counter() - start
        chunks.append(chunk.samples)
    return np.concatenate(chunks), first, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoTokenizer, VitsModel

    from mizuoto_engine_vits.make_weights import write
    from mizuoto_sdk.host import RuntimeService

    with tempfile.TemporaryDirectory() as tmp:
        folder = write(Path(tmp) / "mid", seed=0, overrides=MID)
        model = VitsModel.from_pretrained(folder).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder)
        service = RuntimeService()
        service.settings.set("engines.vits.model_dir", str(folder))
        handle = service.load("vits")
        rate = int(handle.description["sample_rate"])  # type: ignore[call-overload]
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"checkpoint: {params:.1f}M parameters (transformers' count, posterior included)")
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU, float32\n")

        for row, text in (("sentence", SENTENCE), ("paragraph", PARAGRAPH)):
            best_ours = [float("inf")] * 2  # first chunk, total
            best_theirs = float("inf")
            same = True
            for _ in range(args.repeats):
                audio, first, total = ours(handle, text)
                reference, seconds = theirs(model, tokenizer, text)
                best_ours = [min(best_ours[0], first), min(best_ours[1], total)]
                best_theirs = min(best_theirs, seconds)
                if row == "sentence":
                    same = same and np.array_equal(audio, reference)
            audio_ours = audio.size / rate
            audio_theirs = reference.size / rate
            rtf_ours, rtf_theirs = audio_ours / best_ours[1], audio_theirs / best_theirs
            print(f"{row}: {audio_ours:.2f} s of audio (transformers {audio_theirs:.2f} s)")
            print(
                f"  real-time factor  ours {rtf_ours:6.1f}x  transformers {rtf_theirs:6.1f}x  "
                f"ratio {rtf_ours / rtf_theirs:.2f}x"
            )
            print(
                f"  first chunk       ours {best_ours[0] * 1e3:6.0f} ms  transformers "
                f"{best_theirs * 1e3:6.0f} ms  ratio {best_theirs / best_ours[0]:.2f}x"
            )
            if row == "sentence":
                print(f"  same audio: {same}")


if __name__ == "__main__":
    main()
