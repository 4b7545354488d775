"""Text normalisation for speech: numbers, dates, money, units and symbols spelt out as wetext does.

wetext (WeTextProcessing's FSTs, read by kaldifst, no model download: the grammars ship in its
wheel) is an optional package, the extra ``wetext``. ``normalize(text, lang, **options)`` returns
exactly ``wetext.Normalizer(lang=lang, operator="tn", **options).normalize(text)``. One
normaliser is kept per language and options, made under a lock on first use and shared by every
thread after that.
"""

from __future__ import annotations

import threading
from typing import Any, Literal

from mizuoto_runtime.text._extras import require

__all__ = ["LANGUAGES", "OPTIONS", "normalize"]

LANGUAGES = ("zh", "en")
# wetext's switches (NormalizerConfig), all off by default.
OPTIONS = (
    "fix_contractions",
    "traditional_to_simple",
    "full_to_half",
    "remove_interjections",
    "remove_puncts",
    "tag_oov",
    "remove_erhua",
)

_normalizers: dict[tuple[str, tuple[tuple[str, bool], ...]], Any] = {}
_lock = threading.Lock()


def normalize(text: str, lang: Literal["zh", "en"], **options: bool) -> str:
    """``text`` with numbers, dates, money, units and symbols written as words of ``lang``:
    "2024年3月5日" -> "二零二四年三月五日", "I have 2 cats" -> "I have two cats".

    ``options`` are wetext's switches, named in ``OPTIONS`` (``remove_erhua=True``, ...)."""
    if lang not in LANGUAGES:
        raise ValueError(f"lang: expected one of {', '.join(LANGUAGES)}, got {lang!r}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown options {', '.join(unknown)}; known: {', '.join(OPTIONS)}")
    result: str = _normalizer(lang, tuple(sorted(options.items()))).normalize(text)
    return result


def _normalizer(lang: str, options: tuple[tuple[str, bool], ...]) -> Any:
    key = (lang, options)
    found = _normalizers.get(key)
    if found is not None:
        return found
    with _lock:
        if key not in _normalizers:
            wetext = require("wetext", "normalize")  # reads every grammar: about 0.4 s, once
            _normalizers[key] = wetext.Normalizer(lang=lang, operator="tn", **dict(options))
        return _normalizers[key]
