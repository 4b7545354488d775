"""Encode throughput of mizuoto_runtime.text.Tokenizer against transformers' AutoTokenizer.

Both read the same folder: a Qwen2-style byte-level BPE tokenizer (NFC, the Qwen2 split regex,
ChatML special tokens, about 8k ids) trained here on a mixed corpus and saved by transformers.
Each encodes a few MB of mixed text (English, accents, CJK, emoji, code, special tokens) one text
at a time and as one batch; the ids must be equal, and the ratio is ours / transformers':

    python benchmarks/tokenizer.py [--megabytes 3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from mizuoto_runtime.text import Tokenizer

PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
COMMON = [
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at",
    "from", "speech", "model", "voice", "token", "audio", "Café", "naïve", "résumé", "Ångström",
    "façade", "😀", "🎉", "👍🏽", "def", "return", "42", "3.14", "1,000", "$3.50"
]  # fmt: skip


def vocabulary(rng: random.Random) -> list[str]:
    """Made-up words in Latin, Cyrillic and CJK script: enough kinds for an 8k vocabulary."""
    latin = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "é", "ou")]
    cyrillic = [c + v for c in "бвгдзклмнпрст" for v in "аеиоуя"]
    words = ["".join(rng.choices(latin, k=rng.randint(1, 4))) for _ in range(6000)]
    words += ["".join(rng.choices(cyrillic, k=rng.randint(1, 3))) for _ in range(1500)]
    words += [
        "".join(chr(rng.randint(0x4E00, 0x4E00 + 800)) for _ in range(2)) for _ in range(2000)
    ]
    return words + COMMON * 50


def corpus(megabytes: float, seed: int = 0) -> list[str]:
    """Lines of mixed text, about ``megabytes`` MB of UTF-8 in all, the same for a seed."""
    rng = random.Random(seed)
    pool = vocabulary(rng)
    lines: list[str] = []
    size = 0
    while size < megabytes * 1e6:
        words = rng.choices(pool, k=rng.randint(5, 40))
        if rng.random() < 0.1:
            words.insert(rng.randrange(len(words)), rng.choice(SPECIALS))
        line = " ".join(words) + rng.choice([".", "!", "?", "。", "\n", "  "])
        lines.append(line)
        size += len(line.encode())
    return lines


def make_folder(folder: Path, lines: Sequence[str]) -> Path:
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
    from tokenizers import Tokenizer as Backend
    from transformers import PreTrainedTokenizerFast

    backend = Backend(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8192,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(lines, trainer)
    PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    ).save_pretrained(folder)
    return folder


def best_seconds(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Print one line per way of encoding; return ours / transformers' throughput for each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    lines = corpus(args.megabytes)
    megabytes = sum(len(line.encode()) for line in lines) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_folder(Path(tmp), lines[:20_000])
        ours = Tokenizer.from_pretrained(folder)
        theirs = AutoTokenizer.from_pretrained(folder)
    ways: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "one text at a time": (
            lambda: [ours.encode(line) for line in lines],
            lambda: [theirs.encode(line, add_special_tokens=False) for line in lines],
        ),
        "one batch": (
            lambda: ours.encode_batch(lines),
            lambda: theirs(lines, add_special_tokens=False)["input_ids"],
        ),
    }
    print(f"{len(lines)} texts, {megabytes:.2f} MB, vocabulary {len(ours)}; best of {args.repeats}")
    ratios = {}
    for name, (ours_run, theirs_run) in ways.items():
        if ours_run() != theirs_run():
            raise SystemExit(f"{name}: the ids differ from transformers'")
        mine = best_seconds(ours_run, args.repeats)
        peer = best_seconds(theirs_run, args.repeats)
        ratios[name] = peer / mine
        print(
            f"{name:>20}: text.Tokenizer {megabytes / mine:6.2f} MB/s, "
            f"transformers {megabytes / peer:6.2f} MB/s, ratio {ratios[name]:.2f}x"
        )
    print(f"geometric mean ratio {statistics.geometric_mean(ratios.values()):.2f}x (goal >= 0.90x)")
    return ratios


if __name__ == "__main__":
    main()
