"""text.WhisperTokenizer against openai-whisper's own tokenizer, on the vocabularies it ships."""

# ruff: noqa: RUF001  (full-width and CJK punctuation is what this file is about)

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mizuoto_runtime.text import WhisperTokenizer
from mizuoto_runtime.text.whisper import LANGUAGES, TO_LANGUAGE_CODE

whisper_tokenizer = pytest.importorskip("whisper.tokenizer")
ASSETS = Path(whisper_tokenizer.__file__).parent / "assets"

TEXTS = [
    "",
    "Hello world, it's 3:45pm.",
    "  spaces   and\ttabs\nnewlines  ",
    "東京は日本の首都です。北京欢迎你！",
    "Привет, мир! 😀🎉 café naïve",
    "♪♪ ( SPEAKING FOREIGN LANGUAGE ) [DAVID] Hey there,",
]
CASES = [
    (False, 99, None, None),
    (True, 99, None, None),
    (True, 99, "ja", "translate"),
    (True, 99, "German", "transcribe"),
    (True, 99, "mandarin", None),
    (True, 100, "yue", "transcribe"),
    (True, 100, "fr", "translate"),
]


def pair(multilingual, num_languages, language, task):
    vocab = ASSETS / ("multilingual.tiktoken" if multilingual else "gpt2.tiktoken")
    ours = WhisperTokenizer.from_file(
        vocab, multilingual=multilingual, num_languages=num_languages, language=language, task=task
    )
    theirs = whisper_tokenizer.get_tokenizer(
        multilingual, num_languages=num_languages, language=language, task=task
    )
    return ours, theirs


def test_the_language_tables_are_whispers():
    assert tuple(LANGUAGES) == tuple(whisper_tokenizer.LANGUAGES)
    assert TO_LANGUAGE_CODE == whisper_tokenizer.TO_LANGUAGE_CODE


@pytest.mark.parametrize("case", CASES, ids=str)
def test_special_tokens_and_sequences_equal_whispers(case):
    ours, theirs = pair(*case)
    for name in (
        "eot", "sot", "transcribe", "translate", "sot_lm", "sot_prev", "no_speech",
        "no_timestamps", "timestamp_begin", "sot_sequence", "sot_sequence_including_notimestamps",
        "language", "task", "special_tokens",
    ):  # fmt: skip
        assert getattr(ours, name) == getattr(theirs, name), name
    # whisper lists them in its special-token set's order, which varies between processes
    assert sorted(ours.all_language_tokens) == sorted(theirs.all_language_tokens)
    assert sorted(ours.all_language_codes) == sorted(theirs.all_language_codes)
    assert [ours.to_language_token(c) for c in ours.all_language_codes] == list(
        ours.all_language_tokens
    )
    for code in LANGUAGES[: case[1]]:
        assert ours.to_language_token(code) == theirs.to_language_token(code)
    if ours.language is not None:
        assert ours.language_token == theirs.language_token


@pytest.mark.parametrize("case", CASES[:2] + CASES[-1:], ids=str)
def test_encode_decode_and_timestamps_equal_whispers(case):
    ours, theirs = pair(*case)
    for text in TEXTS:
        ids = theirs.encode(text)
        assert ours.encode(text) == ids
        assert ours.decode(ids) == theirs.decode(ids)
    mixed = [
        *ours.sot_sequence,
        ours.timestamp_begin,
        *ours.encode(" Hi there."),
        ours.timestamp_begin + 54,
        ours.eot,
    ]
    assert ours.decode(mixed) == theirs.decode(mixed)
    assert ours.decode_with_timestamps(mixed) == theirs.decode_with_timestamps(mixed)
    assert "<|1.08|>" in ours.decode_with_timestamps(mixed)
    with pytest.raises(ValueError):
        ours.encode("a <|endoftext|> inside")
    assert ours.encode("<|endoftext|>", allowed_special="all") == [ours.eot]


@settings(max_examples=40, deadline=None)
@given(text=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30))
def test_any_text_encodes_as_whisper_does(text):
    ours, theirs = pair(True, 100, "en", "transcribe")
    assert ours.encode(text, disallowed_special=()) == theirs.encode(text, disallowed_special=())
    ids = theirs.encode(text, disallowed_special=())
    assert ours.decode(ids) == theirs.decode(ids)


def test_unknown_languages_and_tasks_are_refused():
    vocab = ASSETS / "multilingual.tiktoken"
    with pytest.raises(ValueError, match="unsupported language"):
        WhisperTokenizer.from_file(vocab, language="klingon")
    with pytest.raises(ValueError):  # cantonese is the 100th: not in a 99-language vocabulary
        WhisperTokenizer.from_file(vocab, language="yue", num_languages=99)
    with pytest.raises(ValueError, match="task"):
        WhisperTokenizer.from_file(vocab, task="summarize")  # type: ignore[arg-type]
