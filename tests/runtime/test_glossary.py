"""Glossary terms found in a text (twostep/runtime/glossary.py): word boundaries, case, leftmost-longest, against an
obvious reference on random texts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twostep.errors import BadInput
from twostep.runtime.glossary import Entry, Glossary, bounded


def found(glossary: Glossary, text: str) -> list[tuple[str, str]]:
    return [(text[f.start:f.end], f.entry.source) for f in glossary.find(text)]


def test_a_term_is_found_at_word_boundaries_only():
    g = Glossary([Entry("cat", ("chat",))])
    assert found(g, "category: a cat, the cat's bowl, cats") == [("cat", "cat"), ("cat", "cat")]
    assert found(g, "cat") == [("cat", "cat")] and found(g, "concat") == []


def test_leftmost_longest_without_overlap():
    g = Glossary([Entry(t, ("x",)) for t in ("new york", "york city", "new york city", "city hall")])
    assert found(g, "new york city hall") == [("new york city", "new york city")]
    assert found(g, "new york, city hall") == [("new york", "new york"), ("city hall", "city hall")]


def test_a_candidate_refused_at_a_boundary_hides_nothing():
    g = Glossary([Entry("ab cd", ("x",)), Entry("cd ef", ("y",)), Entry("ab", ("z",))])
    assert found(g, "xab cd ef") == [("cd ef", "cd ef")]  # "ab cd" starts inside "xab"
    assert found(g, "ab cdx") == [("ab", "ab")]  # "ab cd" ends inside "cdx"; "ab" at the same place stands


def test_case_is_folded_only_where_an_entry_ignores_it():
    g = Glossary([Entry("Apple", ("Apple",)), Entry("straße", ("street",), ignore_case=True)])
    assert found(g, "apple APPLE Apple") == [("Apple", "Apple")]
    assert found(g, "STRASSE, Straße und strasse") == [("STRASSE", "straße"), ("Straße", "straße"),
                                                       ("strasse", "straße")]
    assert found(g, "Straßen") == []  # a fold that ends inside a word is no match either


def test_scripts_without_spaces_have_a_boundary_everywhere():
    g = Glossary([Entry("猫", ("cat",)), Entry("ねこ", ("cat",))])
    assert found(g, "我的猫很好。ねこです") == [("猫", "猫"), ("ねこ", "ねこ")]


@pytest.mark.parametrize("entries, message", [
    ([Entry("a", ("b",)), Entry("a", ("c",))], "twice"),
    ([Entry("A", ("b",), True), Entry("a", ("c",), True)], "twice"),
])
def test_a_term_given_twice_is_refused(entries, message):
    with pytest.raises(BadInput, match=message):
        Glossary(entries)


@pytest.mark.parametrize("source, targets", [(" ", ("b",)), ("a", ()), ("a", ("b", " "))])
def test_an_empty_term_is_refused(source, targets):
    with pytest.raises(BadInput, match="empty"):
        Entry(source, targets)


def reference(entries: list[Entry], text: str) -> list[tuple[int, int, str]]:
    """Every place each term occurs (each span of the text compared with each term), kept at word boundaries,
    then leftmost-longest chosen in one pass (exact case first where two are found at one place)."""
    spans = []
    for i in range(len(text)):
        for j in range(i + 1, len(text) + 1):
            for e in entries:
                same = (text[i:j].casefold() == e.source.casefold()) if e.ignore_case else text[i:j] == e.source
                if same and bounded(text, i, j):
                    spans.append((i, j, e.source, e.ignore_case))
    out = []
    for i, j, source, _ in sorted(spans, key=lambda s: (s[0], s[0] - s[1], s[3])):
        if not out or i >= out[-1][1]:
            out.append((i, j, source))
    return out


ALPHABET = "asAS ß.猫"  # ß folds to ss: a term of s may meet half of it
terms = st.text(ALPHABET, min_size=1, max_size=4).filter(lambda t: t.strip())


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.tuples(terms, st.booleans()), min_size=1, max_size=5,
                unique_by=lambda t: (t[0].casefold() if t[1] else t[0], t[1])),
       st.text(ALPHABET, max_size=24))
def test_the_search_equals_the_obvious_reference(terms_and_case, text):
    entries = [Entry(term, ("x",), ignore_case) for term, ignore_case in terms_and_case]
    glossary = Glossary(entries)
    assert [(f.start, f.end, f.entry.source) for f in glossary.find(text)] == reference(entries, text)
