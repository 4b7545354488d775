"""Text and voice to prompt tokens: bytes, a few speaker tokens, and the codec's own ids.

One vocabulary serves the decoder's input and output. Codec codes come first (ids 0 .. C-1, then
the end-of-audio id C), so that the next-frame scores are the first C + 1 logits and sampling
needs no id remapping; text comes last, as its UTF-8 bytes. Between them: BOS, SEP and the
speaker tokens, ``slots`` groups of ``levels`` ids that spell a quantised speaker embedding (the
decoder reads token ids only, so a voice conditions it as a short prefix of tokens).

    [BOS, byte, byte, ..., SEP, speaker_0, ..., speaker_7]  ->  code, code, ..., END
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from mizuoto_sdk import InvalidRequest

if TYPE_CHECKING:
    import numpy as np

BYTES = 256


def _positive(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"tokens.{attribute.name}: expected an integer > 0, got {value!r}")


@attrs.frozen(kw_only=True)
class TokenConfig:
    """The vocabulary's sizes, as config.json's ``tokens`` section gives them."""

    codebook: int = attrs.field(validator=_positive)
    speaker_slots: int = attrs.field(validator=_positive)
    speaker_levels: int = attrs.field(validator=_positive)
    max_text_bytes: int = attrs.field(validator=_positive)

    @classmethod
    def from_dict(cls, raw: Mapping[str, object]) -> TokenConfig:
        return cls(**raw)  # type: ignore[arg-type]


class ByteTokenizer:
    """UTF-8 bytes in, prompt ids out; every id range is named by an attribute."""

    def __init__(self, config: TokenConfig) -> None:
        self.config = config
        self.end = config.codebook  # end of audio: the last id the decoder may pick
        self.bos = self.end + 1
        self.sep = self.end + 2
        self.speaker_base = self.end + 3
        self.byte_base = self.speaker_base + config.speaker_slots * config.speaker_levels
        self.vocab_size = self.byte_base + BYTES

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
        ids = [self.bos, *(self.byte_base + b for b in self.text_bytes(text)), self.sep]
        if embedding is not None:
            ids += self.speaker_tokens(embedding)
        return ids
