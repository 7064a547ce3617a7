"""Glossary terms found in a text (twostep/runtime/glossary.py): word boundaries, case, leftmost-longest, against an
obvious reference on random texts."""

from __future__ import annotations

import re

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


def test_entries_are_read_from_tsv_and_csv_as_deepl_takes_them():
    from twostep.runtime.glossary import parse_entries

    tsv = parse_entries("cat\tchat\n\n  dog \t chien\tclebs\n")
    assert [(e.source, e.targets) for e in tsv] == [("cat", ("chat",)), ("dog", ("chien", "clebs"))]
    csv = parse_entries('cat,chat\r\n"new, york","New York",NY\n', "csv", ignore_case=True)
    assert [(e.source, e.targets, e.ignore_case) for e in csv] == [
        ("cat", ("chat",), True), ("new, york", ("New York", "NY"), True)]


@pytest.mark.parametrize("text, fmt, message", [
    ("cat\tchat\ndog\n", "tsv", "glossary line 2: a source term, a tab, then its target; got 'dog'"),
    ("cat,chat\ndog\n", "csv", "glossary line 2: a source term, a comma, then its target"),
    ('cat,"chat\n', "csv", "the glossary is not valid CSV: unexpected end of data"),
    ("cat\t \n", "tsv", "glossary line 1: the glossary entry 'cat' has an empty target term"),
    ("\tchat\n", "tsv", "glossary line 1: a glossary entry has an empty source term"),
    ("x" * 257 + "\tchat\n", "tsv", "glossary line 1: the glossary term 'xxxx"),
    ("cat\tchat\n", "xlsx", "a glossary's format is one of tsv, csv"),
])
def test_a_malformed_glossary_is_refused_with_its_line(text, fmt, message):
    from twostep.runtime.glossary import parse_entries

    with pytest.raises(BadInput, match="^" + re.escape(message)):
        parse_entries(text, fmt)


def test_a_sentence_s_terms_are_constrained_by_their_target_variants():
    """sentence_terms: each term found, its targets' token sequences (any one of them) one constraint term; a term
    none of whose targets the model can write is found but unmet from the start; no term: None."""
    from twostep.runtime.glossary import sentence_terms

    g = Glossary([Entry("cat", ("chat", "matou")), Entry("dog", ("chien",)), Entry("bird", ("oiseau",))])
    variants = {"chat": [(5, 6), (7,)], "matou": [(8,)], "chien": [(9,)], "oiseau": []}.get
    terms = sentence_terms(g, "a bird, a dog and a cat", variants)
    assert [f.entry.source for f in terms.found] == ["bird", "dog", "cat"]
    assert terms.constrained == (1, 2)
    assert terms.constraints.terms == (((9,),), ((5, 6), (7,), (8,)))
    applied, unmet = terms.outcome([1])
    assert [f.entry.source for f in applied] == ["dog"] and [f.entry.source for f in unmet] == ["bird", "cat"]
    assert sentence_terms(g, "nothing here", variants) is None


def test_a_target_term_is_also_met_by_each_piece_that_holds_it_whole(monkeypatch):
    """The demo model writes German numbers in compound pieces: "sieben" is written by "▁siebenhundert" as well
    as by its own pieces; a term held by more than MAX_HOLDERS pieces (too short to say anything) gets none."""
    from pathlib import Path

    from twostep.runtime import tokenizer

    tok = tokenizer.Tokenizer.sentencepiece(Path(__file__).parents[2] / "twostep" / "demo" / "model" /
                                            "tokenizer.model")
    variants = tok.target_variants("sieben")
    assert [[tok.target_piece(i) for i in v] for v in variants[:2]] == [["▁", "sieben"], ["sieben"]]
    holders = {tok.target_piece(v[0]) for v in variants[2:]}
    assert all(len(v) == 1 for v in variants[2:])
    assert {"▁siebenhundert", "siebenundzwanzig", "hundertsieben", "siebentausend"} <= holders
    assert holders == {p for i, p in ((i, tok.target_piece(i)) for i, _ in tok.target_texts())
                       if "sieben" in p.replace("▁", " ")} - {"sieben"}
    monkeypatch.setattr(tokenizer, "MAX_HOLDERS", len(holders))  # "sieben" itself is one more
    assert tok.target_variants("sieben") == variants[:2]
