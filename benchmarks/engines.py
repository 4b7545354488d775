"""The bundled real-model engines against transformers, both in one command.

Runs ``benchmarks/engines_vits.py`` (MMS-TTS through the host against ``VitsModel``) and
``engines_csm.py`` (Sesame CSM through the host against ``CsmForConditionalGeneration.generate``)
with their defaults, one after another, each in a process of its own so that one's memory and
threads are not the next one's start:

    python benchmarks/engines.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = ("engines_vits.py", "engines_csm.py")


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
