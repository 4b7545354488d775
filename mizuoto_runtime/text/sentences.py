"""Sentences for streaming synthesis: an engine speaks the first while the text of the rest waits.

``split_sentences`` keeps every character (``"".join(pieces) == text``): the whitespace after a
sentence stays with it, so a piece starts at its first word. Rules, in the order they decide:

- A newline ends a sentence (a title, a list item, a paragraph), punctuation or not.
- ``。！？｡`` end a sentence where they stand, with any closing quotes or brackets after them.
- ``. ! ? …`` end one only when whitespace (or the end) follows them and their closing quotes
  and brackets, so ``3.50``, ``1,000.5``, ``U.S.A`` and ``example.com`` stay whole. Then:

  - a closing quote or bracket followed by a lower-case word is speech inside the sentence
    (``"Hi." she said``);
  - an ellipsis ends a sentence unless a lower-case word follows (``wait... what``);
  - a period after a title (Dr., Mr., Prof., ...), after ``e.g.``, ``i.e.``, ``cf.``, ``vs.``,
    or after a single capital (the initials in ``J. R. R. Tolkien``) ends nothing;
    after ``No.``, ``Vol.``, ``p.``, ``Fig.`` ... nothing when a number follows; after other
    abbreviations (``etc.``, ``Inc.``, ``U.S.``, ``a.m.``) only when a capital follows.

A sentence longer than ``max_length`` characters is cut softly: after the last clause mark
(``, ; : 、 ， ；`` ...) that keeps the piece within the limit, else at the last whitespace, else
(a long run of CJK or one long word) at the limit itself. Every rule is a regular expression or
a set lookup: the split is deterministic and linear in the text's length.
"""

# ruff: noqa: RUF001, RUF002  (full-width and CJK punctuation is what this file is about)

from __future__ import annotations

import re
import unicodedata

__all__ = ["split_sentences"]

_CLOSE = "\"'”’»›)\\]}」』）】》〕〉"
_CANDIDATE = re.compile(
    rf"(?P<mark>[.!?…。！？｡]+)(?P<close>[{_CLOSE}]*)(?P<space>\s*)|(?P<newline>[^\S\n]*\n\s*)"
)
_CJK_MARKS = frozenset("。！？｡")
_OPEN = "\"'“‘«‹([{「『（【《〔〈"
_INITIALISM = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")
_CLAUSE = re.compile(r"(?P<mark>[,;:](?=\s)|[、，；：—])\s*|(?P<space>\s+)")

# A period after these never ends a sentence.
_TITLES = frozenset((
    "mr", "mrs", "ms", "mx", "dr", "prof", "sr", "jr", "st", "mt", "rev", "hon", "gen", "col",
    "capt", "lt", "sgt", "gov", "sen", "rep", "pres", "fr", "e.g", "i.e", "cf", "vs", "viz",
    "approx"
))  # fmt: skip
# ... nor after these when a number follows.
_BEFORE_NUMBERS = frozenset((
    "no", "nos", "vol", "vols", "p", "pp", "ch", "sec", "art", "fig", "figs", "eq", "op"
))  # fmt: skip
# ... and after these only when a capital follows.
_ABBREVIATIONS = frozenset((
    "etc", "inc", "ltd", "co", "corp", "bros", "dept", "est", "jan", "feb", "mar", "apr", "jun",
    "jul", "aug", "sep", "sept", "oct", "nov", "dec", "a.m", "p.m", "u.s", "u.k", "u.n", "ph.d"
))  # fmt: skip


def split_sentences(text: str, max_length: int | None = None) -> list[str]:
    """``text`` cut into sentences, each with the whitespace after it; ``max_length`` (characters,
    None for no limit) cuts longer ones softly. Only whitespace-only text gives a piece without
    a word; empty text gives none."""
    if max_length is not None and max_length < 1:
        raise ValueError(
            f"max_length: expected a count of characters >= 1 or None, got {max_length}"
        )
    pieces: list[str] = []
    start = 0
    for match in _CANDIDATE.finditer(text):
        end = match.end()
        if end == len(text) or not _ends_sentence(text, match):
            continue
        if text[start:end].strip():  # never a piece of whitespace alone: it joins the next one
            pieces.append(text[start:end])
            start = end
    if start < len(text):
        if pieces and not text[start:].strip():
            pieces[-1] += text[start:]
        else:
            pieces.append(text[start:])
    if max_length is None:
        return pieces
    return [part for piece in pieces for part in _soft_split(piece, max_length)]


def _ends_sentence(text: str, match: re.Match[str]) -> bool:
    if match["newline"] is not None:
        return True
    mark, close, space = match["mark"], match["close"], match["space"]
    if _CJK_MARKS.intersection(mark):
        return True
    if not space:
        return False
    if "\n" in space:
        return True
    after = text[match.end()]
    if close and after.islower():
        return False
    if "!" in mark or "?" in mark:
        return True
    if "…" in mark or len(mark) > 1:
        return not after.islower()
    before = text[max(0, match.start() - 32) : match.start()]  # a bounded look back: linear
    token = before.split()[-1].strip(_OPEN + _CLOSE) if before and not before[-1].isspace() else ""
    name = token.lower()
    if name in _TITLES:
        return False
    if name in _BEFORE_NUMBERS and after.isdigit():
        return False
    if len(token) == 1 and token.isupper() and token != "I":
        return False
    if name in _ABBREVIATIONS or _INITIALISM.fullmatch(token):
        return after.isupper()
    return True


def _soft_split(piece: str, max_length: int) -> list[str]:
    """``piece`` in parts of at most ``max_length`` characters besides their trailing whitespace."""
    parts: list[str] = []
    while len(piece.rstrip()) > max_length:
        clause_cut = space_cut = 0
        for clause in _CLAUSE.finditer(piece, 0, max_length + 1):
            if clause.start() == 0 or not piece[: clause.start()].strip():
                continue
            if clause["mark"] is not None and clause.start() < max_length:
                clause_cut = clause.end()
            elif clause["space"] is not None:
                space_cut = clause.end()
        cut = clause_cut or space_cut
        if cut == 0:
            cut = max_length
            while cut > 1 and unicodedata.combining(piece[cut]):  # keep a letter and its accents
                cut -= 1
        while cut < len(piece) and piece[cut].isspace():
            cut += 1
        parts.append(piece[:cut])
        piece = piece[cut:]
    if piece:
        parts.append(piece)
    return parts
