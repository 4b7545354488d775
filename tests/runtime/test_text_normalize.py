"""text.normalize against wetext's own Normalizer (its grammars ship in the wheel: no download)."""

# ruff: noqa: RUF001  (full-width and CJK punctuation is what this file is about)

from __future__ import annotations

import pytest

from mizuoto_runtime.text import normalize

wetext = pytest.importorskip("wetext")

ZH = [
    "今天是2024年3月5日，星期二。",
    "价格是¥35.5元，打8折后是28.4元。",
    "温度-3℃到12℃，湿度85%。",
    "电话13812345678，邮编100080。",
    "他跑了1.5km，用了12分30秒，时速约7.2km/h。",
    "第3章第12节，共1/4。",
    "早上8:30开会，下午3点结束。",
    "哪儿有卖2斤苹果的？",
    "2020-01-01至2021-12-31",
]
EN = [
    "Dr. Smith paid $3.50 on Jan. 5, 2024 for 12kg at 3:30pm, 50% off.",
    "I have 2 cats and 1,000 dogs.",
    "It costs £1.25 or €7, and the 3rd item is 10.5 ft long.",
    "Call 555-1234 before 10:00 a.m. on 12/25/2023.",
    "The score was 3-2, temperature 72°F.",
    "Mr. Jones can't go; he's 35 years old.",
    "Plain words only",
]


@pytest.mark.parametrize(("lang", "text"), [("zh", t) for t in ZH] + [("en", t) for t in EN])
def test_normalize_equals_wetext(lang, text):
    assert normalize(text, lang) == wetext.Normalizer(lang=lang, operator="tn").normalize(text)


@pytest.mark.parametrize(
    ("lang", "text", "options"),
    [
        ("zh", "哪儿有卖2斤苹果的？", {"remove_erhua": True}),
        ("zh", "現在是２０２４年", {"traditional_to_simple": True, "full_to_half": True}),
        ("en", "I can't pay $5, um, today!", {"fix_contractions": True, "remove_puncts": True}),
    ],
)
def test_options_equal_wetexts(lang, text, options):
    expected = wetext.Normalizer(lang=lang, operator="tn", **options).normalize(text)
    assert normalize(text, lang, **options) == expected


def test_unknown_languages_and_options_are_named():
    with pytest.raises(ValueError, match="lang"):
        normalize("1", "fr")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="remove_everything"):
        normalize("1", "en", remove_everything=True)
