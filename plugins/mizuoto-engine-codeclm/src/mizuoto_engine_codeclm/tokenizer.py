"""Text and voice to prompt tokens: bytes, a few speaker tokens, and the codec's own ids.

One vocabulary serves the decoder's input and output. Codec codes come first (ids 0 .. C-1, then
the end-of-audio id C), so that the next-frame scores are the first C + 1 logits and sampling
needs no id remapping; text comes last, as its UTF-8 bytes. Between them: BOS, SEP and the
speaker tokens, ``slots`` groups of ``levels`` ids that spell a quantised speaker embedding (the
decoder reads token ids only, so a voice conditions it as a short prefix of tokens).

    [BOS, byte, byte, ..., SEP, speaker_0, ..., speaker_7]  ->  code, code, ..., END

The text part is a tokenizer folder as the Hub ships one: ``tokenizer.json`` beside the weights,
read by ``mizuoto_runtime.text.Tokenizer``. It is byte-level BPE without merges (every UTF-8 byte
is one token, its id ``byte_base + byte``, no normalisation), and its post-processor writes BOS
before the text and SEP after it. ``tokenizer_json`` makes that file from config.json's
``tokens`` section (``python -m mizuoto_engine_codeclm.make_tokenizer``), so it is reproducible
byte for byte, as the weights are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from mizuoto_sdk import InvalidRequest

if TYPE_CHECKING:
    import numpy as np

    from mizuoto_runtime.text import Tokenizer

BYTES = 256
TOKENIZER_FILE = "tokenizer.json"


def _positive(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"tokens.{attribute.name}: expected an integer > 0, got {value!r}")


@attrs.frozen(kw_only=True)
class TokenConfig:
    """The vocabulary's sizes, as config.json's ``tokens`` section gives them, and the id
    ranges they imply."""

    codebook: int = attrs.field(validator=_positive)
    speaker_slots: int = attrs.field(validator=_positive)
    speaker_levels: int = attrs.field(validator=_positive)
    max_text_bytes: int = attrs.field(validator=_positive)

    @classmethod
    def from_dict(cls, raw: Mapping[str, object]) -> TokenConfig:
        return cls(**raw)  # type: ignore[arg-type]

    @property
    def end(self) -> int:
        """End of audio: the last id the decoder may pick."""
        return self.codebook

    @property
    def bos(self) -> int:
        return self.end + 1

    @property
    def sep(self) -> int:
        return self.end + 2

    @property
    def speaker_base(self) -> int:
        return self.end + 3

    @property
    def byte_base(self) -> int:
        return self.speaker_base + self.speaker_slots * self.speaker_levels

    @property
    def vocab_size(self) -> int:
        return self.byte_base + BYTES


def tokenizer_json(config: TokenConfig) -> str:
    """The text of ``tokenizer.json`` for ``config``: every id named, bytes as ByteLevel spells
    them, BOS and SEP around the text; the same text for the same config, always."""
    names = [f"<|code_{i}|>" for i in range(config.codebook)] + ["<|end|>", "<|bos|>", "<|sep|>"]
    names += [
        f"<|speaker_{slot}_{level}|>"
        for slot in range(config.speaker_slots)
        for level in range(config.speaker_levels)
    ]
    names += [_BYTE_CHARS[byte] for byte in range(BYTES)]
    special = {
        name: {
            "id": name,
            "ids": [config.bos if name == "<|bos|>" else config.sep],
            "tokens": [name],
        }
        for name in ("<|bos|>", "<|sep|>")
    }

    def around(sequence: str, type_id: int) -> list[dict[str, object]]:
        return [
            {"SpecialToken": {"id": "<|bos|>", "type_id": type_id}},
            {"Sequence": {"id": sequence, "type_id": type_id}},
            {"SpecialToken": {"id": "<|sep|>", "type_id": type_id}},
        ]

    document: dict[str, object] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
            "use_regex": False,
        },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": around("A", 0),
            "pair": around("A", 0) + around("B", 1),
            "special_tokens": special,
        },
        "decoder": {
            "type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
            "use_regex": False,
        },
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {name: index for index, name in enumerate(names)},
            "merges": [],
        },
    }  # fmt: skip
    return json.dumps(document, ensure_ascii=False, indent=1) + "\n"


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte (what a ByteLevel pre-tokenizer writes): the
    printable Latin-1 bytes stand for themselves, the others for 256 + their rank among them."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [byte for byte in range(BYTES) if byte not in printable]
    chars = {byte: chr(byte) for byte in printable}
    chars.update({byte: chr(BYTES + rank) for rank, byte in enumerate(others)})
    return [chars[byte] for byte in range(BYTES)]


_BYTE_CHARS = _byte_chars()


class PromptTokenizer:
    """Text and voice in, prompt ids out; every id range is named by an attribute."""

    def __init__(self, config: TokenConfig, text: Tokenizer) -> None:
        if len(text) != config.vocab_size or text.encode("A") != [config.byte_base + ord("A")]:
            raise ValueError(
                f"{TOKENIZER_FILE} does not match config.json's tokens section; rebuild it with "
                "python -m mizuoto_engine_codeclm.make_tokenizer"
            )
        self.config = config
        self.text = text
        self.end = config.end
        self.bos = config.bos
        self.sep = config.sep
        self.speaker_base = config.speaker_base
        self.byte_base = config.byte_base
        self.vocab_size = config.vocab_size

    @classmethod
    def from_pretrained(
        cls, model_dir: str | os.PathLike[str], config: TokenConfig
    ) -> PromptTokenizer:
        """The tokenizer folder beside the weights (``tokenizer.json``), checked against config."""
        from mizuoto_runtime.text import Tokenizer

        return cls(config, Tokenizer.from_pretrained(model_dir))

    @property
    def audio_vocab(self) -> int:
        """How many leading ids are outputs: every code and the end-of-audio id."""
        return self.end + 1

    def text_bytes(self, text: str) -> bytes:
        """The text's UTF-8 bytes, or InvalidRequest naming ``text`` when it is empty or long."""
        if not isinstance(text, str):
            raise InvalidRequest(
                f"text: expected a string, got {type(text).__name__}", {"field": "text"}
            )
        try:
            data = text.strip().encode("utf-8")
        except UnicodeEncodeError as error:  # a lone surrogate, from a bad decode upstream
            raise InvalidRequest(
                f"text: holds a lone surrogate ({error.object[error.start]!r}), which is not a "
                "character; send valid Unicode text",
                {"field": "text"},
            ) from None
        if not data:
            raise InvalidRequest("text: is empty; give the words to speak", {"field": "text"})
        if len(data) > self.config.max_text_bytes:
            raise InvalidRequest(
                f"text: {len(data)} UTF-8 bytes is more than this model's "
                f"{self.config.max_text_bytes}; split it into sentences and synthesize each",
                {"field": "text", "limit": self.config.max_text_bytes},
            )
        return data

    def speaker_tokens(self, embedding: Sequence[float] | np.ndarray) -> list[int]:
        """Each embedding value in [-1, 1] rounded to one of ``levels`` steps, one slot each."""
        slots, levels = self.config.speaker_slots, self.config.speaker_levels
        if len(embedding) != slots:
            raise ValueError(f"speaker embedding: expected {slots} values, got {len(embedding)}")
        steps = [round((min(max(float(v), -1.0), 1.0) + 1) / 2 * (levels - 1)) for v in embedding]
        return [self.speaker_base + slot * levels + step for slot, step in enumerate(steps)]

    def prompt(self, text: str, embedding: Sequence[float] | np.ndarray | None = None) -> list[int]:
        """``[BOS, bytes..., SEP, speaker...]``; without a voice the speaker tokens are left out."""
        self.text_bytes(text)  # the checks: a string, not empty, not too long, no lone surrogate
        ids = self.text.encode(text.strip(), add_special_tokens=True)
        if embedding is not None:
            ids += self.speaker_tokens(embedding)
        return ids
