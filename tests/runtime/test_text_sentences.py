"""text.split_sentences: every character kept, and the cases streaming synthesis meets."""

# ruff: noqa: RUF001  (full-width and CJK punctuation is what this file is about)

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mizuoto_runtime.text import split_sentences

CASES = {
    "Hello there. How are you? Fine!": ["Hello there. ", "How are you? ", "Fine!"],
    "Dr. Smith met Mr. Jones and Mrs. Lee at St. Mary's. They talked.": [
        "Dr. Smith met Mr. Jones and Mrs. Lee at St. Mary's. ",
        "They talked.",
    ],
    "Bring fruit, e.g. apples, i.e. red ones. Thanks.": [
        "Bring fruit, e.g. apples, i.e. red ones. ",
        "Thanks.",
    ],
    "Apples, pears, etc. are fine. Bring them etc. Then go.": [
        "Apples, pears, etc. are fine. ",
        "Bring them etc. ",
        "Then go.",
    ],
    "She moved to the U.S. last year. I live in the U.S. It is big.": [
        "She moved to the U.S. last year. ",
        "I live in the U.S. ",
        "It is big.",
    ],
    "It costs $3.50 today. It was 1,000.5 units. Pi is 3.14.": [
        "It costs $3.50 today. ",
        "It was 1,000.5 units. ",
        "Pi is 3.14.",
    ],
    "Wait... what? I thought… No. Well... maybe.": [
        "Wait... what? ",
        "I thought… ",
        "No. ",
        "Well... maybe.",
    ],
    '"Hi." she said. He said "stop!" Then he left.': [
        '"Hi." she said. ',
        'He said "stop!" ',
        "Then he left.",
    ],
    "(See the note.) Next one. [Really?] Yes.": [
        "(See the note.) ",
        "Next one. ",
        "[Really?] ",
        "Yes.",
    ],
    "你好。今天天气很好！是吗？好的": ["你好。", "今天天气很好！", "是吗？", "好的"],
    "他说：“走吧。”我们就走了。": ["他说：“走吧。”", "我们就走了。"],
    "本当？！はい。": ["本当？！", "はい。"],
    "Title\n\nFirst paragraph. Still first.\nA list item\n- another": [
        "Title\n\n",
        "First paragraph. ",
        "Still first.\n",
        "A list item\n",
        "- another",
    ],
    "J. R. R. Tolkien wrote it. See No. 5 and Fig. 2 at 5 p.m. today. Done.": [
        "J. R. R. Tolkien wrote it. ",
        "See No. 5 and Fig. 2 at 5 p.m. today. ",
        "Done.",
    ],
    "Visit example.com or mail a@b.co now. OK.": ["Visit example.com or mail a@b.co now. ", "OK."],
    "no punctuation at all here": ["no punctuation at all here"],
    "  leading space. trailing space.  ": ["  leading space. ", "trailing space.  "],
    "": [],
    "   ": ["   "],
    "\n\nHello": ["\n\nHello"],
}


@pytest.mark.parametrize("text", sorted(CASES))
def test_cases(text):
    assert split_sentences(text) == CASES[text]


def test_long_text_without_punctuation_is_cut_softly_at_max_length():
    text = "one two three, four five six seven, eight nine ten eleven twelve"
    assert split_sentences(text, max_length=20) == [
        "one two three, ",
        "four five six seven, ",
        "eight nine ten ",
        "eleven twelve",
    ]
    assert split_sentences("一二三四五六七八九十、一二三四五六七八九十一二三", max_length=12) == [
        "一二三四五六七八九十、",
        "一二三四五六七八九十一二",
        "三",
    ]
    assert split_sentences(text) == [text]  # no limit by default
    with pytest.raises(ValueError, match="max_length"):
        split_sentences(text, max_length=0)


_pieces = st.sampled_from(
    [". ", "! ", "? ", "...", "…", "。", "！", "？", "\n", "\n\n", '" ', "”", ") ", "Dr. ",
     "U.S. ", "e.g. ", "$3.50", "1,000.5", ", ", "、", " ", "  ", "a", "B", "é", "東", "\u0301"]
)  # fmt: skip
_texts = st.lists(_pieces | st.text(max_size=6), max_size=30).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=_texts, max_length=st.none() | st.integers(1, 40))
def test_every_character_is_kept(text, max_length):
    pieces = split_sentences(text, max_length)
    assert "".join(pieces) == text
    assert all(piece.strip() for piece in pieces) or pieces == [text]
    if max_length is not None:
        assert all(len(piece.rstrip()) <= max_length for piece in pieces)
    assert split_sentences(text, max_length) == pieces  # deterministic


def test_a_megabyte_splits_in_well_under_a_second():
    text = 'Dr. Smith paid $3.50 for it... Really? "Yes." she said. 你好。好的！\n' * 15_000
    started = time.perf_counter()
    pieces = split_sentences(text, max_length=200)
    assert time.perf_counter() - started < 1.0
    assert "".join(pieces) == text and len(pieces) == 15_000 * 5
