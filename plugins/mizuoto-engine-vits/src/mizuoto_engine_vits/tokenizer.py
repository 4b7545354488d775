"""Text -> ids as transformers' ``VitsTokenizer`` makes them, from a folder's vocab.json and
tokenizer_config.json. Torch-free.

The steps are upstream's, quirks included:

1. ``normalize``: lowercase each character unless a vocabulary entry (vocab.json, then the added
   tokens by id) starts there, in which case that entry is kept as written (first match in that
   order, not the longest).
2. ``language == "ron"``: ``ț`` (comma below) becomes ``ţ`` (cedilla).
3. ``is_uroman`` and a non-ASCII character: romanised by the ``uroman`` package when it is
   installed; without it upstream only warns, this engine refuses the text (``InvalidRequest``
   naming ``text``) rather than speak a text with its letters dropped.
4. ``normalize``: characters that are not vocab.json entries are dropped, then ``strip()``.
5. The text is cut at every added token (special tokens such as the pad token, leftmost-longest),
   each added token becomes its own id with no blanks around it, and every other piece becomes
   one id per character, with ``add_blank``'s id 0 between and around the characters. A
   character outside the vocabulary (only possible without ``normalize``) is the unknown id.

``phonemize`` (espeak through ``phonemizer``) is refused when loading: this engine does not run
espeak, and anything else would give other ids.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

from mizuoto_sdk import InvalidRequest
from mizuoto_sdk.errors import EngineUnavailable

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token")
"""The special-token settings transformers registers as added tokens, in its order (the order
decides the ids of those not in vocab.json)."""
_DEFAULT_SPECIALS = {"unk_token": "<unk>", "pad_token": "<pad>"}  # VitsTokenizer's own defaults
_UNSUPPORTED = ("additional_special_tokens", "extra_special_tokens", "mask_token")


@dataclass(frozen=True)
class VitsTokenizer:
    """The vocabulary and switches of one folder; ``ids(text)`` is ``VitsTokenizer(text)``'s
    ``input_ids``."""

    vocab: Mapping[str, int]
    added: Mapping[str, int]
    """Added tokens (special ones included), content -> id, in id order."""
    unknown: int | None
    add_blank: bool
    normalize: bool
    is_uroman: bool
    language: str | None

    @classmethod
    def from_folder(cls, folder: str | PathLike[str]) -> VitsTokenizer:
        vocab = _read_json(Path(folder) / "vocab.json")
        config = _read_json(Path(folder) / "tokenizer_config.json")
        if not vocab or not all(
            isinstance(k, str) and k and isinstance(v, int) and not isinstance(v, bool)
            for k, v in vocab.items()
        ):
            raise EngineUnavailable(
                f"{folder}/vocab.json: expected an object of non-empty tokens to integer ids"
            )
        for name in ("add_blank", "normalize", "phonemize", "is_uroman"):
            if not isinstance(config.get(name, name != "is_uroman"), bool):
                raise EngineUnavailable(
                    f"{folder}/tokenizer_config.json: {name}: expected true or false, "
                    f"got {config[name]!r}"
                )
        if config.get("phonemize", True):
            raise EngineUnavailable(
                f"{folder}/tokenizer_config.json: phonemize is true: this model reads espeak "
                "phonemes (phonemizer with espeak-ng), which the vits engine does not run; use a "
                "checkpoint whose tokenizer has phonemize false (MMS-TTS's)"
            )
        for name in _UNSUPPORTED:
            if config.get(name):
                raise EngineUnavailable(
                    f"{folder}/tokenizer_config.json: {name} is not supported by the vits engine"
                )
        added = _added_tokens(folder, vocab, config)
        add_blank = config.get("add_blank", True)
        if add_blank and 0 not in vocab.values():
            raise EngineUnavailable(
                f"{folder}/vocab.json: add_blank needs a token with id 0 (the blank)"
            )
        unk = _content(config.get("unk_token", "<unk>"))
        unknown = None if unk is None else added.get(unk, vocab.get(unk))
        language = config.get("language")
        return cls(
            vocab=dict(vocab),
            added=added,
            unknown=unknown,
            add_blank=add_blank,
            normalize=config.get("normalize", True),
            is_uroman=config.get("is_uroman", False),
            language=language if isinstance(language, str) else None,
        )

    def prepare(self, text: str) -> str:
        """Steps 1-4: the text the ids are read from."""
        if self.normalize:
            text = self._lowercase(text)
        if self.language == "ron":
            text = text.replace("ț", "ţ")
        if self.is_uroman and not text.isascii():
            text = _romanise(text)
        if self.normalize:
            text = "".join(c for c in text if c in self.vocab).strip()
        return text

    def ids(self, text: str) -> list[int]:
        """The ids of ``text``: empty when nothing of it is in the vocabulary."""
        prepared = self.prepare(text)
        out: list[int] = []
        for piece in self._pieces(prepared):
            if piece in self.added:
                out.append(self.added[piece])
                continue
            chars = [self._char_id(c) for c in piece]
            if self.add_blank:
                blank = self._blank
                out.append(blank)
                for char in chars:
                    out += (char, blank)
            else:
                out += chars
        return out

    @property
    def _blank(self) -> int:
        token = next(k for k, v in self.vocab.items() if v == 0)
        return self.added.get(token, 0)

    def _char_id(self, char: str) -> int:
        found = self.vocab.get(char, self.unknown)
        if found is None:
            raise InvalidRequest(
                f"text: {char!r} is not in the model's vocabulary and it has no unknown token",
                {"field": "text"},
            )
        return found

    def _lowercase(self, text: str) -> str:
        words = [*self.vocab, *self.added]
        out: list[str] = []
        i = 0
        while i < len(text):
            word = next((w for w in words if text.startswith(w, i)), None)
            if word is None:
                out.append(text[i].lower())
                i += 1
            else:
                out.append(word)
                i += len(word)
        return "".join(out)

    def _pieces(self, text: str) -> list[str]:
        if not self.added or not text:
            return [text] if text else []
        tokens = sorted(self.added, key=len, reverse=True)
        pattern = "(" + "|".join(re.escape(t) for t in tokens) + ")"
        return [p for p in re.split(pattern, text) if p]


def _romanise(text: str) -> str:
    try:
        import uroman  # type: ignore[import-not-found]
    except ImportError:
        raise InvalidRequest(
            "text: this model reads romanised text and the text has non-ASCII characters; "
            "install uroman (pip install uroman) or give the text in ASCII",
            {"field": "text"},
        ) from None
    return str(uroman.Uroman().romanize_string(text))


def _added_tokens(
    folder: str | PathLike[str], vocab: Mapping[str, int], config: Mapping[str, Any]
) -> dict[str, int]:
    """Added tokens as transformers registers them: ``added_tokens_decoder``, then each special
    token (its vocab.json id, or the next free id)."""
    added: dict[str, int] = {}
    for key, token in (config.get("added_tokens_decoder") or {}).items():
        if not isinstance(token, dict) or not isinstance(token.get("content"), str):
            raise EngineUnavailable(
                f"{folder}/tokenizer_config.json: added_tokens_decoder[{key}]: expected "
                "an object with a content string"
            )
        if any(token.get(flag) for flag in ("lstrip", "rstrip", "single_word")):
            raise EngineUnavailable(
                f"{folder}/tokenizer_config.json: added_tokens_decoder[{key}]: lstrip, rstrip "
                "and single_word are not supported by the vits engine"
            )
        added[token["content"]] = int(key)
    extra = Path(folder) / "added_tokens.json"  # older folders: content -> id
    if extra.is_file():
        for text, key in _read_json(extra).items():
            if not isinstance(key, int) or isinstance(key, bool):
                raise EngineUnavailable(f"{extra}: {text!r}: expected an integer id")
            added.setdefault(text, key)
    next_id = max([*vocab.values(), *added.values()]) + 1
    for name in SPECIAL_TOKENS:
        content = _content(config.get(name, _DEFAULT_SPECIALS.get(name)))
        if content is None or content in added:
            continue
        if content in vocab:
            added[content] = vocab[content]
        else:
            added[content] = next_id
            next_id += 1
    return dict(sorted(added.items(), key=lambda item: item[1]))


def _content(value: object) -> str | None:
    """A special token setting's text: a string, or an AddedToken-like object's ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EngineUnavailable(f"{path.parent}: no {path.name} (the tokenizer needs it)") from None
    except (OSError, ValueError) as error:
        raise EngineUnavailable(f"{path}: not a readable JSON file: {error}") from None
    if not isinstance(value, dict):
        raise EngineUnavailable(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value
