"""``mizuoto_runtime.nn`` against its references, every family in one command.

Runs ``benchmarks/nn_codecs.py`` (EnCodec, Mimi), ``nn_vocoders.py`` (HiFi-GAN, DAC, Vocos,
BigVGAN), ``nn_encoders.py`` (wav2vec 2.0, HuBERT, WavLM) and ``nn_speakers.py`` (ECAPA-TDNN)
with their defaults, one after another, each in a process of its own so that one's memory peak
is not the next one's start:

    python benchmarks/nn.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = ("nn_codecs.py", "nn_vocoders.py", "nn_encoders.py", "nn_speakers.py")


def main() -> None:
    failed = []
    for part in PARTS:
        print(f"\n== {part}", flush=True)
        if subprocess.run([sys.executable, str(HERE / part)], check=False).returncode:
            failed.append(part)
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
