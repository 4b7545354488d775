"""ECAPA-TDNN (``mizuoto_runtime.nn.ecapa``) against the re-derived SpeechBrain model, same run.

SpeechBrain is not installed, so the peer is ``benchmarks/_ref_ecapa.py``: upstream's modules and
forward re-derived in plain torch (the tests compare both bit for bit). Rows: ``voxceleb``, the
shape of ``speechbrain/spkrec-ecapa-voxceleb`` (80 mels, channels 1024 x 4 and 3072, 192
outputs), and ``default``, upstream's default arguments (512 x 4 and 1536); each randomly
initialised and written to a temporary folder as the Hub ships it, then loaded by both sides.
The input is ``--seconds`` of 10 ms fbank frames for a batch of ``--batch`` utterances, with
relative lengths from 1.0 down to 0.6 when the batch holds more than one. Calls alternate, so
both meet the same machine load; the best of ``--repeats`` is printed as seconds of audio per
second of compute, with ours / reference (above 1.0x we are faster). ``same`` says whether the
embeddings were bitwise equal.

Peak memory, on the CPU only: the peak resident set of a fresh process that loads the folder and
runs the row once, less its resident set after the imports.

    python benchmarks/nn_speakers.py [--rows voxceleb default] [--seconds 4] [--batch 1]
        [--repeats 5] [--device cpu|cuda]

float32 only: upstream's forward does not run in bfloat16 (its float32 masks meet bfloat16
weights), so there is no peer to time against.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _ref_ecapa import EcapaReference, save_folder  # benchmarks/ is on sys.path as a script
from _timing import alternating_best, status_mib  # benchmarks/ is on sys.path when run as a script

ROWS: dict[str, dict[str, Any]] = {
    "voxceleb": {
        "channels": [1024, 1024, 1024, 1024, 3072],
        "kernel_sizes": [5, 3, 3, 3, 1],
        "dilations": [1, 2, 3, 4, 1],
        "attention_channels": 128,
        "lin_neurons": 192,
    },
    "default": {},
}
MELS = 80
FRAMES_PER_SECOND = 100


def inputs(seconds: float, batch: int, device: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    frames = round(seconds * FRAMES_PER_SECOND) + 1
    features = torch.randn(batch, frames, MELS, generator=torch.Generator().manual_seed(1))
    lengths = torch.linspace(1.0, 0.6, batch) if batch > 1 else None
    return features.to(device), None if lengths is None else lengths.to(device)


def load(side: str, row: str, folder: Path, device: str) -> Callable[..., torch.Tensor]:
    """Ours from the folder, or the reference built with the row's fields and the folder's
    state dict loaded strictly."""
    if side == "ours":
        from mizuoto_runtime.nn import ecapa

        return ecapa.load(folder, device=device)
    model = EcapaReference(MELS, **ROWS[row])
    model.load_state_dict(torch.load(folder / "embedding_model.ckpt", weights_only=True))
    return model.to(device).eval()


def peak_child(side: str, row: str, folder: str, seconds: float, batch: int) -> None:
    """Run in a fresh process: print the peak MiB above the post-import resident set."""
    import yaml  # type: ignore[import-untyped]  # noqa: F401  (ours reads hyperparams with it)

    import mizuoto_runtime.nn.ecapa  # noqa: F401

    features, lengths = inputs(seconds, batch, "cpu")
    baseline = status_mib("VmRSS")
    function = load(side, row, Path(folder), "cpu")
    with torch.inference_mode():
        function(features, lengths)
    print(status_mib("VmHWM") - baseline)


def peak_mib(side: str, row: str, folder: Path, args: argparse.Namespace) -> float | None:
    if args.device != "cpu":
        return None
    command = [sys.executable, __file__, "--peak-child", side, row, str(folder)]
    command += [str(args.seconds), str(args.batch)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def compare(
    row: str, folder: Path, args: argparse.Namespace, sync: Callable[[], None]
) -> tuple[float, float, bool]:
    """Best seconds of ours and of the reference, and whether all bits agree."""
    ours, theirs = (load(side, row, folder, args.device) for side in ("ours", "reference"))
    features, lengths = inputs(args.seconds, args.batch, args.device)
    with torch.inference_mode():
        same = torch.equal(ours(features, lengths), theirs(features, lengths))
        mine, peer = alternating_best(
            lambda: ours(features, lengths), lambda: theirs(features, lengths), args.repeats, sync
        )
    return mine, peer, same


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--peak-child":
        side, row, folder, seconds, batch = sys.argv[2:7]
        peak_child(side, row, folder, float(seconds), int(batch))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    print(
        f"{args.seconds:g} s of audio, batch {args.batch}, float32 on {args.device}, "
        f"{torch.get_num_threads()} threads, best of {args.repeats}"
    )
    header = f"{'row':<9} {'ours s/s':>9} {'ref s/s':>9} {'ratio':>6}"
    print(f"{header} {'ours MiB':>9} {'ref MiB':>9}  same")
    audio = args.seconds * args.batch
    with tempfile.TemporaryDirectory() as root:
        for row in args.rows:
            folder = Path(root) / row
            save_folder(folder, n_mels=MELS, **ROWS[row])
            mine, peer, same = compare(row, folder, args, sync)
            memory = [peak_mib(side, row, folder, args) for side in ("ours", "reference")]
            shown = [f"{m:>9.1f}" if m is not None else f"{'-':>9}" for m in memory]
            print(
                f"{row:<9} {audio / mine:>9.2f} {audio / peer:>9.2f} {peer / mine:>5.2f}x "
                f"{shown[0]} {shown[1]}  {same}"
            )


if __name__ == "__main__":
    main()
