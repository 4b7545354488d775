"""Speech encoders (``mizuoto_runtime.nn``) against transformers' models in the same run.

For each family a randomly initialised checkpoint of the base architecture (768 wide, 12 layers,
the default ``Wav2Vec2Config`` / ``HubertConfig`` / ``WavLMConfig``) is written to a temporary
folder; both sides load it and encode the same noise. Calls alternate, so both meet the same
machine load; the best of ``--repeats`` is printed as seconds of audio encoded per second, with
ours / transformers (above 1.0x: we are faster). ``same`` says whether every hidden state was
bitwise equal.

Peak memory: on the CPU, the peak resident set of a fresh process that loads the folder and
encodes once, less its resident set after the imports (so: weights touched plus the forward's
working memory); on CUDA, ``torch.cuda.max_memory_allocated`` over one encode after loading.

    python benchmarks/nn_encoders.py [--families wavlm] [--seconds 10] [--batch 1]
        [--repeats 5] [--layers 12] [--device cpu|cuda] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from _timing import alternating_best, status_mib  # benchmarks/ is on sys.path when run as a script

RATE = 16_000


def _model_class(family: str) -> tuple[type, type]:
    import transformers

    names = {
        "wav2vec2": ("Wav2Vec2Config", "Wav2Vec2Model"),
        "hubert": ("HubertConfig", "HubertModel"),
        "wavlm": ("WavLMConfig", "WavLMModel"),
    }[family]
    return getattr(transformers, names[0]), getattr(transformers, names[1])


def save_checkpoint(folder: Path, family: str, layers: int) -> Path:
    config_class, model_class = _model_class(family)
    with torch.random.fork_rng():
        torch.manual_seed(0)  # allowed: a script of its own, inside fork_rng
        model_class(config_class(num_hidden_layers=layers)).save_pretrained(folder)
    return folder


def load(side: str, folder: Path, family: str, device: str, dtype: torch.dtype) -> Callable:
    """A function audio -> hidden states, for ``side`` ``ours`` or ``transformers``."""
    if side == "ours":
        from mizuoto_runtime.nn import load_speech_encoder

        return load_speech_encoder(folder, device=device, dtype=dtype)
    model = _model_class(family)[1].from_pretrained(folder, dtype=dtype).to(device).eval()
    return lambda audio: model(audio, output_hidden_states=True).hidden_states


def peak_child(side: str, folder: str, family: str, samples: int, batch: int, dtype: str) -> None:
    """Run in a fresh process: print the peak MiB above the post-import resident set."""
    # both sides' modules imported before the baseline (transformers imports lazily)
    _model_class(family)[1]
    import mizuoto_runtime.nn.wav2vec2  # noqa: F401

    baseline = status_mib("VmRSS")
    encode = load(side, Path(folder), family, "cpu", getattr(torch, dtype))
    with torch.inference_mode():
        encode(torch.randn(batch, samples, dtype=getattr(torch, dtype)))
    print(status_mib("VmHWM") - baseline)


def peak_mib(side: str, folder: Path, family: str, args: argparse.Namespace, dtype: torch.dtype):
    if args.device == "cpu":
        command = [sys.executable, __file__, "--peak-child", side, str(folder), family]
        command += [str(args.seconds * RATE), str(args.batch), str(dtype).removeprefix("torch.")]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
        return float(result.stdout.strip().splitlines()[-1])
    encode = load(side, folder, family, args.device, dtype)
    audio = torch.randn(args.batch, args.seconds * RATE, device=args.device, dtype=dtype)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    with torch.inference_mode():
        encode(audio)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - start) / 2**20


def compare(
    family: str, args: argparse.Namespace, dtype: torch.dtype, sync: Callable[[], None]
) -> tuple[float, float, list[float], bool]:
    """Best seconds of ours and of transformers, both peaks in MiB, and whether all bits agree."""
    with tempfile.TemporaryDirectory() as folder_name:
        folder = save_checkpoint(Path(folder_name), family, args.layers)
        ours = load("ours", folder, family, args.device, dtype)
        theirs = load("transformers", folder, family, args.device, dtype)
        audio = torch.randn(args.batch, args.seconds * RATE).to(args.device, dtype)
        with torch.inference_mode():
            same = all(torch.equal(a, b) for a, b in zip(ours(audio), theirs(audio), strict=True))
            mine, peer = alternating_best(
                lambda: ours(audio), lambda: theirs(audio), args.repeats, sync
            )
        memory = [peak_mib(side, folder, family, args, dtype) for side in ("ours", "transformers")]
    return mine, peer, memory, same


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--peak-child":
        side, folder, family, samples, batch, dtype = sys.argv[2:8]
        peak_child(side, folder, family, int(samples), int(batch), dtype)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", nargs="+", default=["wav2vec2", "hubert", "wavlm"])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    audio_seconds = args.seconds * args.batch
    print(
        f"{args.batch} x {args.seconds} s of audio at {RATE} Hz, {args.layers} layers, "
        f"{args.dtype} on {args.device}, best of {args.repeats}; speed in seconds of audio "
        "per second; peak MiB as the module docstring says"
    )
    header = f"{'family':<10}{'ours x':>9}{'hf x':>9}{'ours/hf':>9}"
    print(header + f"{'ours MiB':>10}{'hf MiB':>9}{'same':>6}")
    for family in args.families:
        mine, peer, memory, same = compare(family, args, dtype, sync)
        print(
            f"{family:<10}{audio_seconds / mine:>9.1f}{audio_seconds / peer:>9.1f}"
            f"{peer / mine:>8.2f}x{memory[0]:>10.0f}{memory[1]:>9.0f}{'yes' if same else 'NO':>6}"
        )
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
