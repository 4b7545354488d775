"""A tokenizer folder as the Hub ships it, encoded and decoded as transformers 5.x does.

The ``tokenizers`` library (Rust) does the work: normalisation, pre-tokenisation, BPE, added
tokens, decoding. What transformers adds on top, and this module repeats without importing it,
is how the folder's other files change that tokenizer (``TokenizersBackend.__init__`` and
``PreTrainedTokenizerBase._from_pretrained`` in transformers 5.24):

- Every entry of ``added_tokens_decoder`` in tokenizer_config.json is added again, with its own
  ``special``/``normalized``/``lstrip``/``rstrip``/``single_word`` flags: a token already in
  tokenizer.json takes the config's flags, a new one gets the next free id.
- Named special tokens (``bos_token``, ``eos_token``, ..., and any other ``*_token`` key) and
  ``extra_special_tokens`` (formerly ``additional_special_tokens``) that the tokenizer lacks are
  added as special tokens. Without ``added_tokens_decoder``, the legacy special_tokens_map.json
  and added_tokens.json are read instead.
- ``add_bos_token``/``add_eos_token`` are dropped when tokenizer.json exists (transformers 5
  does the same): its post-processor alone decides what ``add_special_tokens=True`` adds.
- ``split_special_tokens`` makes special tokens in the text plain text.
- ``clean_up_tokenization_spaces`` is ignored for BPE models, as transformers ignores it, unless
  ``clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output`` is also set.
- The chat template is chat_template.jinja when present, else tokenizer_config.json's entry.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mizuoto_runtime.text import chat
from mizuoto_runtime.text._extras import require

if TYPE_CHECKING:
    import tokenizers

__all__ = ["Tokenizer"]

NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
_TOKEN_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")
_CLEAN_UP = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
    (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
)  # fmt: skip


class Tokenizer:
    """Text to ids and back, for one tokenizer folder. Safe to share between threads."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        special_tokens: Mapping[str, str] | None = None,
        chat_template: str | Mapping[str, str] | None = None,
        clean_up_tokenization_spaces: bool = False,
    ) -> None:
        self.backend = backend
        self.special_tokens = dict(special_tokens or {})  # bos_token -> "<s>", ...
        self.chat_template = chat_template
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike[str]) -> Tokenizer:
        """Read ``tokenizer.json`` and, where present, ``tokenizer_config.json``,
        ``chat_template.jinja``, ``special_tokens_map.json`` and ``added_tokens.json``."""
        lib = require("tokenizers", "Tokenizer.from_pretrained")
        root = Path(folder)
        if not (root / "tokenizer.json").is_file():
            raise FileNotFoundError(
                f"{root}: no tokenizer.json; give the folder a Hub tokenizer is saved in"
            )
        config: dict[str, Any] = _read_json(root / "tokenizer_config.json") or {}
        backend = lib.Tokenizer.from_file(str(root / "tokenizer.json"))
        backend.no_truncation()  # transformers' encode() turns both off when asked for neither
        backend.no_padding()
        backend.encode_special_tokens = bool(config.get("split_special_tokens", False))

        named, extra = _special_tokens(config)
        added = _added_tokens(config, root, named, extra)
        known = {token.content for token in backend.get_added_tokens_decoder().values()} | {
            token["content"] for token in added
        }
        for name in (*named, *extra):
            token = named.get(name) or extra[name]
            if token["content"] not in known:
                added.append({**token, "special": True})
                known.add(token["content"])
        if added:
            backend.add_tokens([_added_token(lib, token) for token in added])

        template: str | dict[str, str] | None = config.get("chat_template")
        if isinstance(template, list):  # saved as [{"name": ..., "template": ...}, ...]
            template = {entry["name"]: entry["template"] for entry in template}
        if (root / "chat_template.jinja").is_file():
            template = (root / "chat_template.jinja").read_text(encoding="utf-8")
        clean_up = bool(config.get("clean_up_tokenization_spaces", False)) and (
            type(backend.model).__name__ != "BPE"
            or bool(
                config.get(
                    "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
                )
            )
        )
        return cls(
            backend,
            special_tokens={name: token["content"] for name, token in named.items()},
            chat_template=template,
            clean_up_tokenization_spaces=clean_up,
        )

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The ids of ``text``; ``add_special_tokens`` applies tokenizer.json's post-processor
        (a BOS, for Llama 3). Off by default: prompts built from a chat template have theirs."""
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = False
    ) -> list[list[int]]:
        """``encode`` for each text, in parallel on the library's threads."""
        encodings = self.backend.encode_batch_fast(
            list(texts), add_special_tokens=add_special_tokens
        )
        return [list(encoding.ids) for encoding in encodings]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        text: str = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if self.clean_up_tokenization_spaces:
            for before, after in _CLEAN_UP:
                text = text.replace(before, after)
        return text

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, object]],
        *,
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        chat_template: str | None = None,
        tools: Sequence[Mapping[str, object]] | None = None,
        documents: Sequence[Mapping[str, object]] | None = None,
        **variables: object,
    ) -> list[int] | str:
        """The conversation through the folder's template (or ``chat_template``: a name among
        the folder's templates, or a template itself), as ids or, with ``tokenize=False``, text.

        The template sees the special tokens (``bos_token``, ...) and ``variables``
        (``enable_thinking=False``, ...); tools are JSON schemas."""
        template = chat.pick_template(self.chat_template, chat_template, bool(tools))
        text = chat.render(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            documents=documents,
            variables={**self.special_tokens, **variables},
        )
        return self.encode(text) if tokenize else text

    def token_to_id(self, token: str) -> int | None:
        found: int | None = self.backend.token_to_id(token)
        return found

    def id_to_token(self, id: int) -> str | None:
        found: str | None = self.backend.id_to_token(id)
        return found

    def __len__(self) -> int:
        """Every id, added tokens included (transformers' ``len(tokenizer)``)."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def _token(value: object, **defaults: bool) -> dict[str, Any] | None:
    """A token as a dict of AddedToken fields, from a string or a serialised AddedToken."""
    if isinstance(value, str):
        return {"content": value, **defaults}
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return {key: value[key] for key in ("content", *_TOKEN_FLAGS) if key in value}
    return None


def _special_tokens(
    config: Mapping[str, Any],
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The named special tokens (bos_token, ..., then the model's own ``*_token`` keys) and the
    extra ones, keyed by content, in transformers' order."""
    named: dict[str, dict[str, Any]] = {}
    for name in NAMED_SPECIAL_TOKENS:
        if (token := _token(config.get(name), special=True)) is not None:
            named[name] = token
    for name, value in config.items():
        custom = name.endswith("_token") and name not in NAMED_SPECIAL_TOKENS
        if custom and (token := _token(value, special=True)) is not None:
            named[name] = token
    extras = config.get("extra_special_tokens") or config.get("additional_special_tokens") or ()
    extra: dict[str, dict[str, Any]] = {}
    if isinstance(extras, Mapping):
        for name, value in extras.items():
            if (token := _token(value, special=True)) is not None:
                named.setdefault(name, token)
    else:
        for value in extras:
            if (token := _token(value, special=True)) is not None:
                extra.setdefault(token["content"], token)
    return named, extra


def _added_tokens(
    config: Mapping[str, Any],
    root: Path,
    named: dict[str, dict[str, Any]],
    extra: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    """The tokens transformers adds again after loading tokenizer.json, in id order."""
    by_id: dict[int, dict[str, Any]] = {}
    if "added_tokens_decoder" in config:
        for index, value in config["added_tokens_decoder"].items():
            if (token := _token(value)) is not None:
                by_id[int(index)] = token
    else:
        legacy = _read_json(root / "special_tokens_map.json") or {}
        for name, value in legacy.items():
            if name in ("extra_special_tokens", "additional_special_tokens"):
                for item in value if isinstance(value, list) else ():
                    if (token := _token(item, special=True)) is not None:
                        extra.setdefault(token["content"], {**token, "special": True})
            elif (token := _token(value, special=True)) is not None:
                named[name] = {**token, "special": True}
        specials = {token["content"] for token in (*named.values(), *extra.values())}
        for content, index in (_read_json(root / "added_tokens.json") or {}).items():
            special = content in specials
            by_id[int(index)] = {"content": content, "normalized": not special, "special": special}
        for entry in _read_json(root / "tokenizer.json").get("added_tokens", ()):
            by_id[int(entry["id"])] = {
                key: entry[key] for key in ("content", *_TOKEN_FLAGS) if key in entry
            }
    tokens = [by_id[index] for index in sorted(by_id)]
    by_content = {token["content"]: token for token in tokens}
    for name, token in named.items():  # a named token takes its flags from added_tokens_decoder
        if token["content"] in by_content:
            named[name] = {**by_content[token["content"]], "special": True}
    return tokens


def _added_token(lib: Any, token: Mapping[str, Any]) -> tokenizers.AddedToken:
    return lib.AddedToken(**token)
