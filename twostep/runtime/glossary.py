"""Glossaries: where a glossary's source terms occur in a text, the first step of terminology (issue 50).

A glossary is a list of entries, each a source term and the target variants that may translate it (any one of
them). `Glossary.find(text)` gives the terms found in a text:

- at word boundaries: a term is not found inside a longer word ("cat" is not in "category"); a term's edge that is
  a letter or digit must not touch another letter or digit, except in scripts written without spaces between
  words (Chinese, Japanese, Thai, ...), where any position is a boundary;
- case-folded where the entry (or the whole glossary) ignores case (str.casefold, so "STRASSE" finds "Straße"),
  exactly as written otherwise;
- leftmost-longest and without overlap: of the terms found, the one that starts first wins, of those that start
  there the longest, and of two found at one place the entry of exact case before one that ignores it; the
  search goes on after it.

Every occurrence of every term is found by one Aho-Corasick automaton per case rule (ahocorasick-rs, MIT/Apache),
then the boundary rule is applied, then leftmost-longest is chosen among what is left: a candidate the boundary
rule refuses never hides a shorter one at the same place or a later one inside it.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import ahocorasick_rs

from twostep.errors import BadInput
from twostep.runtime.decoding.constraints import MAX_TERMS, Constraints

MAX_TERM_CHARS = 256  # a source or target term's length, in characters
MAX_ENTRIES = 10_000  # a glossary's entries
FORMATS = ("tsv", "csv")

# Scripts written without spaces between words: a term's edge there is a boundary wherever it falls.
UNSPACED = ("CJK", "HIRAGANA", "KATAKANA", "THAI", "LAO", "KHMER", "MYANMAR", "TIBETAN", "IDEOGRAPHIC")


@dataclass(frozen=True)
class Entry:
    """A source term and the target variants that translate it (any one of them)."""

    source: str
    targets: tuple[str, ...]
    ignore_case: bool = False

    def __post_init__(self):
        if not self.source.strip():
            raise BadInput("a glossary entry has an empty source term")
        if not self.targets or not all(t.strip() for t in self.targets):
            raise BadInput(f"the glossary entry {self.source!r} has an empty target term")
        for term in (self.source, *self.targets):
            if len(term) > MAX_TERM_CHARS:
                raise BadInput(f"the glossary term {term[:40]!r}... has {len(term)} characters, at most "
                               f"{MAX_TERM_CHARS} are taken")


@dataclass(frozen=True)
class Found:
    """An entry found in a text, at text[start:end]."""

    start: int
    end: int
    entry: Entry


class Glossary:
    """Entries, searched for in texts (see the module's docstring). Two entries of one source term (under one case
    rule) are refused: which targets would apply is not said."""

    def __init__(self, entries: Sequence[Entry]):
        self.entries = tuple(entries)
        if len(self.entries) > MAX_ENTRIES:
            raise BadInput(f"the glossary has {len(self.entries)} entries, at most {MAX_ENTRIES} are taken")
        self._searches = []
        for ignore_case in (False, True):
            chosen = [e for e in self.entries if e.ignore_case == ignore_case]
            if not chosen:
                continue
            keys = [e.source.casefold() if ignore_case else e.source for e in chosen]
            repeated = sorted(k for k, n in Counter(keys).items() if n > 1)
            if repeated:
                raise BadInput(f"the glossary has the source term {repeated[0]!r} twice")
            automaton = ahocorasick_rs.AhoCorasick(keys, matchkind=ahocorasick_rs.MatchKind.Standard)
            self._searches.append((ignore_case, automaton, chosen))

    def find(self, text: str) -> list[Found]:
        """The entries found in `text`, leftmost-longest, without overlap, in the order they occur."""
        candidates: list[Found] = []
        for ignore_case, automaton, chosen in self._searches:
            haystack, origin = folded(text) if ignore_case else (text, None)
            for index, start, end in automaton.find_matches_as_indexes(haystack, overlapping=True):
                if origin is not None:  # back to the text's own positions: a fold may change a length
                    if (start and origin[start] == origin[start - 1]) or (
                            end < len(origin) and origin[end] == origin[end - 1]):
                        continue  # it starts or ends inside one character's fold
                    start, end = origin[start], (origin[end] if end < len(origin) else len(text))
                if bounded(text, start, end):
                    candidates.append(Found(start, end, chosen[index]))
        out: list[Found] = []
        for found in sorted(candidates, key=lambda f: (f.start, f.start - f.end, f.entry.ignore_case)):
            if not out or found.start >= out[-1].end:
                out.append(found)
        return out


def folded(text: str) -> tuple[str, list[int]]:
    """text.casefold(), and for each of its characters the index of the text's character it comes from."""
    pieces, origin = [], []
    for i, char in enumerate(text):
        fold = char.casefold()
        pieces.append(fold)
        origin += [i] * len(fold)
    return "".join(pieces), origin


def bounded(text: str, start: int, end: int) -> bool:
    """Whether text[start:end] stands at word boundaries (see the module's docstring)."""
    return not (start > 0 and joins(text[start - 1], text[start])) and not (
        end < len(text) and joins(text[end - 1], text[end]))


def joins(a: str, b: str) -> bool:
    """Whether two neighbouring characters belong to one word: both letters or digits, of spaced scripts."""
    return a.isalnum() and b.isalnum() and not (unspaced(a) or unspaced(b))


def unspaced(char: str) -> bool:
    return unicodedata.name(char, "").startswith(UNSPACED)


def parse_entries(text: str, fmt: str = "tsv", ignore_case: bool = False) -> list[Entry]:
    """A glossary's entries as DeepL takes them: one a line, the source term then its target, separated by a tab
    ("tsv") or a comma ("csv", RFC 4180 quoting); further fields are further target variants (any one of them).
    Blank lines are skipped; a line with fewer than two fields is refused with its number."""
    import csv
    import io

    if fmt not in FORMATS:
        raise BadInput(f"a glossary's format is one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "csv":
        try:
            rows = list(csv.reader(io.StringIO(text), strict=True))
        except csv.Error as exc:
            raise BadInput(f"the glossary is not valid CSV: {exc}") from None
    else:
        rows = [line.split("\t") for line in text.splitlines()]
    entries = []
    for number, row in enumerate(rows, 1):
        fields = [field.strip() for field in row]
        if not any(fields):
            continue
        if len(fields) < 2:
            separator = "a tab" if fmt == "tsv" else "a comma"
            raise BadInput(f"glossary line {number}: a source term, {separator}, then its target; got {row[0][:60]!r}")
        try:
            entries.append(Entry(fields[0], tuple(fields[1:]), ignore_case))
        except BadInput as exc:
            raise BadInput(f"glossary line {number}: {exc}") from None
    return entries


@dataclass(frozen=True)
class Terms:
    """A sentence's glossary terms: those found in it (`found`, in order) and, of those, the ones its translation
    is constrained by (`constraints.terms[i]` is found[constrained[i]]'s target variants as token sequences). A
    term found but not constrained (no tokenization its model can write, or beyond MAX_TERMS) is unmet from the
    start."""

    found: tuple[Found, ...]
    constrained: tuple[int, ...]
    constraints: Constraints | None  # None: not one term could be constrained

    def outcome(self, unmet: Sequence[int]) -> tuple[list[Found], list[Found]]:
        """(applied, unmet) of a hypothesis that misses `unmet` (indices into constraints.terms)."""
        missed = {self.constrained[i] for i in unmet} | (set(range(len(self.found))) - set(self.constrained))
        return ([f for i, f in enumerate(self.found) if i not in missed],
                [f for i, f in enumerate(self.found) if i in missed])


def sentence_terms(glossary: Glossary, text: str, variants) -> Terms | None:
    """The terms of `glossary` found in the sentence `text`, and their constraints: `variants(target)` gives a
    target term's token sequences (Tokenizer.target_variants). None: no term found."""
    found = tuple(glossary.find(text))
    if not found:
        return None
    terms, constrained = [], []
    for i, f in enumerate(found):
        sequences = [v for target in f.entry.targets for v in variants(target)]
        if sequences and len(terms) < MAX_TERMS:
            terms.append(sequences)
            constrained.append(i)
    return Terms(found, tuple(constrained), Constraints.of(terms) if terms else None)
