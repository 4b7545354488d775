"""What the checks speak and with which seeds: texts where engines go wrong, and seeds explored
property-based (bounded, the failing seed shrunk to the smallest one that still fails).

A defect that shows for one seed in fourteen, or only for digits, or only past the first hundred
words, passes a check that speaks one sentence with one seed. The checks that compare or
validate audio speak several texts, each example with a seed of its own; the checks that stop a
stream stop it in a long text. Examples are drawn deterministically (a run is reproducible), and
``--examples N`` searches deeper.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import attrs

from mizuoto_contract.outcome import Fail

DEFAULT_EXAMPLES = 18
"""Seeds per explored property by default (``--examples N``): with the edges, every seed from 0
to 14, so that a defect of one seed in fourteen shows."""
MAX_SHRINKS = 12
"""The most extra calls spent looking for a smaller failing seed."""

_SENTENCES = (
    "The morning train left the station at seven, carrying letters, parcels and a few tired "
    "travellers.",
    "Somebody in the third carriage was reading aloud from a book about the history of bridges.",
    "Outside, the fields turned from grey to green as the sun climbed over the low hills.",
    "At the second stop a child asked why rivers never run out of water, and nobody answered.",
    "The conductor counted tickets twice, then a third time, because the numbers did not agree.",
)
MEDIUM_TEXT = " ".join(_SENTENCES[:2])
"""Two sentences: enough for an engine to stream in more chunks than usual."""
LONG_TEXTS = (" ".join(_SENTENCES * 8), " ".join(_SENTENCES))
"""What a stop or a cancel interrupts, as a reader of a long document sends it: several hundred
words, else (an engine with a length limit refuses them) about eighty."""

SHORT_TEXTS = (
    "Seven bridges.",
    "4.5% & 7/8... #42",
    "東京 Мир.",
)
"""The short texts seeds are explored with (a call costs little), besides the sample text's
first sentence: words, then digits and symbols, then letters not Latin."""


def other_text(index: int) -> str:
    """One of the short texts, by turns: a check that speaks two texts speaks the sample text
    and this one."""
    return SHORT_TEXTS[index % len(SHORT_TEXTS)]


def first_sentence(text: str) -> str:
    """``text`` up to its first sentence end (all of it when it has one sentence)."""
    for index, character in enumerate(text):
        if character in ".!?" and text[index + 1 : index + 2] in ("", " "):
            return text[: index + 1]
    return text


def example_seeds(count: int, first: int) -> list[int]:
    """``count`` seeds: ``first`` (the suite's own), the smallest ones from 0 up, and the edges an
    engine converting seeds gets wrong (2**32 and 2**63 - 1, which a 32-bit seed or
    ``np.random.seed`` cannot take; from 32 examples also 2**31 - 1 and 2**32 - 1). Small ones
    first: the first failure is small."""
    edges = [2**32, 2**63 - 1, 2**31 - 1, 2**32 - 1]
    edges = edges[: max(0, min(len(edges), count // 8))]
    small = [s for s in range(count) if s != first][: max(0, count - 1 - len(edges))]
    return [first, *small, *edges][:count]


@attrs.frozen
class Example:
    """One explored input: a text and a seed."""

    text: str
    seed: int

    def describe(self) -> str:
        text = self.text if len(self.text) <= 40 else self.text[:37] + "..."
        return f"seed {self.seed}, text {text!r}"


def examples(sample_text: str, count: int, first: int) -> list[Example]:
    """``count`` examples: the seeds of ``example_seeds``, the texts taking turns (the sample
    text's first sentence, then each of ``SHORT_TEXTS``)."""
    texts = [first_sentence(sample_text), *SHORT_TEXTS]
    return [
        Example(texts[index % len(texts)], seed)
        for index, seed in enumerate(example_seeds(count, first))
    ]


def digest(audio: bytes) -> str:
    """A take's audio as a short string that another process can compare with."""
    return hashlib.sha256(audio).hexdigest()


def same_take(audio: bytes, earlier: bytes | str) -> bool:
    """Whether ``audio`` is ``earlier``, given as bytes or as their ``digest``."""
    return digest(audio) == earlier if isinstance(earlier, str) else audio == earlier


def explored_to_json(spoken: dict[Example, bytes | None]) -> list[list[object]]:
    """What an exploration heard, for another process: [text, seed, digest or None] each."""
    return [[e.text, e.seed, None if a is None else digest(a)] for e, a in spoken.items()]


def explored_from_json(rows: list[list[object]]) -> dict[Example, str | None]:
    """``explored_to_json``'s rows back, each example's audio as its digest."""
    return {Example(str(t), int(s)): None if d is None else str(d) for t, s, d in rows}  # type: ignore[call-overload]


def explore(prop: Callable[[Example], None], cases: Sequence[Example]) -> None:
    """Run ``prop`` on each example; on the first that fails, look (boundedly) for a smaller
    seed that fails the same way with that text, and fail naming the smallest found."""
    for number, case in enumerate(cases, start=1):
        try:
            prop(case)
        except Fail as failure:
            passed = set(cases[: number - 1])
            raise _shrunk(prop, case, failure, passed, number, len(cases)) from None


def _shrunk(
    prop: Callable[[Example], None],
    case: Example,
    failure: Fail,
    passed: set[Example],
    number: int,
    total: int,
) -> Fail:
    """Bisect between the largest seed seen to pass (0 first) and the smallest seen to fail,
    with the failing example's text, for at most ``MAX_SHRINKS`` calls."""
    smallest, found = case, failure
    below = -1  # a seed below ``smallest`` that passed; -1 until 0 is tried
    shrinks = 0
    while smallest.seed - below > 1 and shrinks < MAX_SHRINKS:
        candidate = Example(smallest.text, 0 if below < 0 else (below + smallest.seed) // 2)
        if candidate not in passed:
            shrinks += 1
            try:
                prop(candidate)
            except Fail as again:
                smallest, found = candidate, again
                continue
        below = candidate.seed
    note = f" (example {number} of {total}"
    note += f", shrunk from seed {case.seed})" if smallest.seed != case.seed else ")"
    return Fail(found.expected, f"{found.observed}, for {smallest.describe()}{note}", found.where)
