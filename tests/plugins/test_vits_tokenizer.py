"""The vits engine's tokenizer against transformers' VitsTokenizer on the same folders.

Each folder is a vocab.json and tokenizer_config.json as ``VitsTokenizer.save_pretrained`` (or
a hand-written Hub-style config) leaves them; both tokenizers read it, and their ids must be
equal for every text, hypothesis-drawn ones included: cases, digits, punctuation, spaces at the
ends, non-ASCII letters, and the special tokens' own text (upstream cuts at those and puts no
blanks around them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, VitsTokenizer

from mizuoto_engine_vits.make_weights import CHARACTERS, WEIGHTS_DIR
from mizuoto_engine_vits.tokenizer import VitsTokenizer as Ours
from mizuoto_sdk import InvalidRequest
from mizuoto_sdk.errors import EngineUnavailable

ALPHABET = st.sampled_from([*"abcXYZkK _-'.,!?0129éÉßİțţ\t\n<>", "<unk>", "<pad>", "k'"])
TEXTS = st.lists(ALPHABET, max_size=30).map("".join)
FOLDERS: dict[str, dict[str, object] | None] = {
    "shipped": None,
    "no-blank": {"add_blank": False},
    "raw": {"normalize": False},
    "romanian": {"language": "ron"},
    "pad-as-token": {"pad_token": "<pad>", "unk_token": "<unk>"},
}
EXTRA_VOCAB = {"romanian": "ţ", "pad-as-token": "<unk>"}


def write_folder(path: Path, settings_: dict[str, object] | None, extra: str = "") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    vocab = {c: i for i, c in enumerate(CHARACTERS)}
    if extra:
        vocab[extra] = len(vocab)
    (path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    config = {"add_blank": True, "normalize": True, "phonemize": False, "pad_token": "k"}
    VitsTokenizer(str(path / "vocab.json"), **{**config, **(settings_ or {})}).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vits_tokenizers")
    out = {"shipped": WEIGHTS_DIR}
    for name, changes in FOLDERS.items():
        if changes is not None:
            out[name] = write_folder(root / name, changes, EXTRA_VOCAB.get(name, ""))
    return out


@pytest.fixture(scope="module")
def pairs(folders):
    return {
        name: (AutoTokenizer.from_pretrained(folder), Ours.from_folder(folder))
        for name, folder in folders.items()
    }


def upstream_ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text)["input_ids"])


@pytest.mark.parametrize("name", list(FOLDERS))
@pytest.mark.parametrize(
    "text",
    [
        "Hello World",
        "  spaces   inside and out  ",
        "ok KK k",
        "numbers 123 and 4.5",
        "<unk> and <pad> as text",
        "ţara și țara",
        "İstanbul ß",
        "",
        "!!!",
    ],
)
def test_ids_equal_upstream_on_chosen_texts(pairs, name, text):
    theirs, ours = pairs[name]
    assert ours.ids(text) == upstream_ids(theirs, text)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=TEXTS, name=st.sampled_from(list(FOLDERS)))
def test_ids_equal_upstream_on_drawn_texts(pairs, text, name):
    theirs, ours = pairs[name]
    assert ours.ids(text) == upstream_ids(theirs, text)


def test_a_hub_style_config_without_added_tokens_reads_as_upstream(tmp_path):
    """MMS-TTS's own tokenizer_config.json lists no added tokens: the special ones are added
    on load (pad ``k`` at its vocab id, ``<unk>`` after the vocabulary)."""
    vocab = {c: i for i, c in enumerate(CHARACTERS)}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    config = {"add_blank": True, "is_uroman": False, "language": "eng", "normalize": True}
    config |= {"phonemize": False, "pad_token": "k", "tokenizer_class": "VitsTokenizer"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    theirs, ours = AutoTokenizer.from_pretrained(tmp_path), Ours.from_folder(tmp_path)
    for text in ("Look, kirk!", "<unk>k", "a  b"):
        assert ours.ids(text) == upstream_ids(theirs, text)


def test_uroman_text_needs_uroman(tmp_path):
    ours = Ours.from_folder(write_folder(tmp_path, {"is_uroman": True}))
    assert ours.ids("plain ascii") == upstream_ids(
        AutoTokenizer.from_pretrained(tmp_path), "plain ascii"
    )
    with pytest.raises(InvalidRequest) as caught:
        ours.ids("naïve")
    assert caught.value.detail["field"] == "text"
    assert "uroman" in caught.value.message


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"phonemize": True}, "phonemize"),
        ({"add_blank": "yes"}, "add_blank"),
    ],
)
def test_unsupported_configs_are_refused_by_name(tmp_path, change, words):
    write_folder(tmp_path, None)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(EngineUnavailable, match=words):
        Ours.from_folder(tmp_path)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(EngineUnavailable, match=r"vocab\.json"):
        Ours.from_folder(tmp_path)
