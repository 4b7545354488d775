"""Whisper's vocabulary: the ids openai-whisper's ``whisper.tokenizer.get_tokenizer`` gives.

The vocabulary file is tiktoken's format (a base64 token and its rank per line: ``gpt2.tiktoken``
for the English-only models, ``multilingual.tiktoken`` for the others), so ``tiktoken`` reads it
(an optional package: the extra ``tiktoken``). After the ranked tokens come the special tokens,
in Whisper's order: end of text, start of transcript, one per language (the first
``num_languages`` of ``LANGUAGES``: 99 before large-v3, 100 from it), translate, transcribe,
start of LM, start of previous text, no speech, no timestamps, then 1501 timestamps
``<|0.00|>`` .. ``<|30.00|>`` in steps of 0.02 s.
"""

from __future__ import annotations

import base64
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from mizuoto_runtime.text._extras import require

if TYPE_CHECKING:
    import tiktoken

__all__ = ["LANGUAGES", "WhisperTokenizer"]

# Whisper's language codes in its token order (the position is the language token's offset).
LANGUAGES = (
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it",
    "id", "hi", "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur",
    "hr", "bg", "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn",
    "et", "mk", "br", "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si",
    "km", "sn", "yo", "so", "af", "oc", "ka", "be", "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo",
    "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl", "mg", "as", "tt", "haw", "ln",
    "ha", "ba", "jw", "su", "yue"
)  # fmt: skip
# Names Whisper accepts for a language, beside the codes: its English names and a few aliases.
_NAMES = (
    "english", "chinese", "german", "spanish", "russian", "korean", "french", "japanese",
    "portuguese", "turkish", "polish", "catalan", "dutch", "arabic", "swedish", "italian",
    "indonesian", "hindi", "finnish", "vietnamese", "hebrew", "ukrainian", "greek", "malay",
    "czech", "romanian", "danish", "hungarian", "tamil", "norwegian", "thai", "urdu", "croatian",
    "bulgarian", "lithuanian", "latin", "maori", "malayalam", "welsh", "slovak", "telugu",
    "persian", "latvian", "bengali", "serbian", "azerbaijani", "slovenian", "kannada", "estonian",
    "macedonian", "breton", "basque", "icelandic", "armenian", "nepali", "mongolian", "bosnian",
    "kazakh", "albanian", "swahili", "galician", "marathi", "punjabi", "sinhala", "khmer", "shona",
    "yoruba", "somali", "afrikaans", "occitan", "georgian", "belarusian", "tajik", "sindhi",
    "gujarati", "amharic", "yiddish", "lao", "uzbek", "faroese", "haitian_creole", "pashto",
    "turkmen", "nynorsk", "maltese", "sanskrit", "luxembourgish", "myanmar", "tibetan", "tagalog",
    "malagasy", "assamese", "tatar", "hawaiian", "lingala", "hausa", "bashkir", "javanese",
    "sundanese", "cantonese"
)  # fmt: skip
TO_LANGUAGE_CODE = {
    **{name.replace("_", " "): code for name, code in zip(_NAMES, LANGUAGES, strict=True)},
    "burmese": "my", "valencian": "ca", "flemish": "nl", "haitian": "ht", "letzeburgesch": "lb",
    "pushto": "ps", "panjabi": "pa", "moldavian": "ro", "moldovan": "ro", "sinhalese": "si",
    "castilian": "es", "mandarin": "zh",
}  # fmt: skip
# Splits text into the pieces BPE runs on, as Whisper's encoding does.
_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
TIMESTAMPS = 1501

_encodings: dict[tuple[str, int, int, int], tiktoken.Encoding] = {}
_encodings_lock = threading.Lock()


class WhisperTokenizer:
    """Text to Whisper's ids and back, with its special tokens by name. Thread-safe."""

    def __init__(
        self,
        encoding: tiktoken.Encoding,
        *,
        num_languages: int,
        language: str | None = None,
        task: Literal["transcribe", "translate"] | None = None,
    ) -> None:
        self.encoding = encoding
        self.num_languages = num_languages
        self.language = language
        self.task = task
        self.special_tokens = {
            token: encoding.encode_single_token(token) for token in encoding.special_tokens_set
        }
        self.eot: int = encoding.eot_token
        self.sot = self.special_tokens["<|startoftranscript|>"]
        self.translate = self.special_tokens["<|translate|>"]
        self.transcribe = self.special_tokens["<|transcribe|>"]
        self.sot_lm = self.special_tokens["<|startoflm|>"]
        self.sot_prev = self.special_tokens["<|startofprev|>"]
        self.no_speech = self.special_tokens["<|nospeech|>"]
        self.no_timestamps = self.special_tokens["<|notimestamps|>"]
        self.timestamp_begin = self.special_tokens["<|0.00|>"]
        codes = LANGUAGES[:num_languages]
        sequence = [self.sot]
        if language is not None:
            sequence.append(self.sot + 1 + codes.index(language))
        if task is not None:
            sequence.append(self.transcribe if task == "transcribe" else self.translate)
        self.sot_sequence = tuple(sequence)
        self.sot_sequence_including_notimestamps = (*self.sot_sequence, self.no_timestamps)
        self.all_language_codes = tuple(codes)
        self.all_language_tokens = tuple(self.sot + 1 + index for index in range(len(codes)))

    @classmethod
    def from_file(
        cls,
        vocab_path: str | os.PathLike[str],
        *,
        multilingual: bool = True,
        num_languages: int = 99,
        language: str | None = None,
        task: Literal["transcribe", "translate"] | None = None,
    ) -> WhisperTokenizer:
        """The tokenizer ``whisper.tokenizer.get_tokenizer(multilingual, ...)`` makes, read from
        ``vocab_path``: multilingual ones default to English transcription; English-only ones
        (gpt2.tiktoken) have neither language nor task."""
        if not 1 <= num_languages <= len(LANGUAGES):
            raise ValueError(f"num_languages: expected 1 to {len(LANGUAGES)}, got {num_languages}")
        if language is not None:
            language = language.lower()
            language = language if language in LANGUAGES else TO_LANGUAGE_CODE.get(language)
            if language is None:
                raise ValueError(
                    f"unsupported language: {language!r}; codes: {' '.join(LANGUAGES)}"
                )
        if task not in (None, "transcribe", "translate"):
            raise ValueError(f"task: expected 'transcribe' or 'translate', got {task!r}")
        if multilingual:
            language, task = language or "en", task or "transcribe"
        else:
            language, task = None, None
        return cls(
            _encoding(Path(vocab_path), num_languages),
            num_languages=num_languages,
            language=language,
            task=task,
        )

    def encode(
        self,
        text: str,
        *,
        allowed_special: Literal["all"] | set[str] = frozenset(),  # type: ignore[assignment]
        disallowed_special: Literal["all"] | set[str] = "all",
    ) -> list[int]:
        """tiktoken's ``encode``: text that spells a special token is an error unless allowed."""
        return self.encoding.encode(
            text, allowed_special=allowed_special, disallowed_special=disallowed_special
        )

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids`` without timestamps (other special tokens stay, spelt out)."""
        return self.encoding.decode([i for i in ids if i < self.timestamp_begin])

    def decode_with_timestamps(self, ids: list[int]) -> str:
        """The text of ``ids`` with timestamps spelt out: ``<|1.08|>``."""
        return self.encoding.decode(ids)

    @property
    def language_token(self) -> int:
        if self.language is None:
            raise ValueError("this tokenizer has no language")
        return self.to_language_token(self.language)

    def to_language_token(self, language: str) -> int:
        token = self.special_tokens.get(f"<|{language}|>")
        if token is None:
            raise KeyError(f"language {language!r} is not in this tokenizer")
        return token


def _encoding(path: Path, num_languages: int) -> tiktoken.Encoding:
    """The file's encoding with Whisper's special tokens, made once per file and size."""
    tiktoken = require("tiktoken", "WhisperTokenizer")
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size, num_languages)
    with _encodings_lock:
        if key in _encodings:
            return _encodings[key]
        ranks = {}
        with path.open("rb") as lines:
            for line in lines:
                if line.strip():
                    token, rank = line.split()
                    ranks[base64.b64decode(token)] = int(rank)
        specials = [
            "<|endoftext|>",
            "<|startoftranscript|>",
            *(f"<|{code}|>" for code in LANGUAGES[:num_languages]),
            "<|translate|>",
            "<|transcribe|>",
            "<|startoflm|>",
            "<|startofprev|>",
            "<|nospeech|>",
            "<|notimestamps|>",
            *(f"<|{i * 0.02:.2f}|>" for i in range(TIMESTAMPS)),
        ]
        encoding = tiktoken.Encoding(
            name=path.name,
            explicit_n_vocab=len(ranks) + len(specials),
            pat_str=_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={token: len(ranks) + i for i, token in enumerate(specials)},
        )
        _encodings[key] = encoding
        return encoding
