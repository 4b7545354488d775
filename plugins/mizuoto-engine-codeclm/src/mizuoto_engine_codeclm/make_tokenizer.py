"""Make the shipped tokenizer: ``python -m mizuoto_engine_codeclm.make_tokenizer [--out DIR]``.

``tokenizer.json`` follows from config.json's ``tokens`` section alone (see tokenizer.py), so
this writes the same bytes every time, which a test checks; anyone can regenerate it instead of
trusting the shipped file. Neither torch nor the tokenizers library is needed to write it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from mizuoto_engine_codeclm.tokenizer import TOKENIZER_FILE, TokenConfig, tokenizer_json

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"


def write(out_dir: str | Path, config_path: str | Path | None = None) -> Path:
    """Write ``tokenizer.json`` for config.json (the package's own by default) into out_dir."""
    raw = json.loads(Path(config_path or WEIGHTS_DIR / "config.json").read_text(encoding="utf-8"))
    out = Path(out_dir) / TOKENIZER_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(tokenizer_json(TokenConfig.from_dict(raw["tokens"])), encoding="utf-8")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mizuoto_engine_codeclm.make_tokenizer", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=WEIGHTS_DIR, help="folder to write into")
    parser.add_argument("--config", type=Path, default=None, help="config.json to build from")
    args = parser.parse_args(argv)
    path = write(args.out, args.config)
    print(f"wrote {path} ({path.stat().st_size / 1e3:.1f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
