"""Whole documents: each text split into sentences, the sentences translated as rows, the translations joined
back with the text between them kept.

A document is its sentences and the text around them, `gaps[0] + s[0] + gaps[1] + ... + s[n-1] + gaps[n]`,
character for character: spaces, line breaks, blank lines between paragraphs, leading and trailing whitespace
are gaps, copied verbatim around the translations. A line break always ends a sentence (a list, a heading, one
sentence a line keep their lines); within a line sentencex finds the sentences (benchmarks/segmenters.py
measured it against pysbd, blingfire and a regex: docs/serving.md#documents). A sentence longer than the model
takes once encoded is cut further: at clause punctuation near its middle, else at the whitespace nearest its
middle, else (Chinese, Japanese: no whitespace at all) at its middle character, again until each piece fits.

The one change joining makes: where the source has no gap between two sentences after a wide character (the
Chinese and Japanese 。 ends a sentence without a space) and both translations meet in a script written with
spaces, one space joins them ("It is raining. I stay home.", not "It is raining.I stay home.").
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sentencex import segment

from twostep.artifact.tokenizer import model_tag
from twostep.errors import BadInput

FALLBACK_LANGUAGE = "en"  # sentencex's rules where the source language is unknown or not given
LINE = re.compile(r"[^\n]+")
# Where a too-long sentence may be cut, after the punctuation: ; : , followed by a space (not 3,000 or 10:30), a
# spaced dash, an em dash, and the wide (CJK) clause marks, which need no space.
CLAUSE = re.compile(r"[;:,]\s+|(?<=\s)[–-]\s+|—\s*|[；：，、]\s*")
WHITESPACE = re.compile(r"\s+")

Span = tuple[int, int]


@functools.lru_cache(maxsize=256)
def segmenter_language(code: str | None) -> str:
    """The language sentencex segments with, from a request's source language: a model's code (fra_Latn, fr_XX,
    fra) or a standard one (fr, fr-FR, zh-Hant) reduced to its language (fr, zh); English when absent or unknown."""
    import langcodes

    if not code:
        return FALLBACK_LANGUAGE
    try:
        return langcodes.Language.get(model_tag(code)).language or FALLBACK_LANGUAGE
    except ValueError:
        return FALLBACK_LANGUAGE


def sentence_spans(text: str, lang: str) -> list[Span]:
    """(start, end) of each sentence of `text`, without the whitespace around it: each line's, by sentencex."""
    spans = []
    for line in LINE.finditer(text):
        at = line.start()
        for piece in segment(lang, line.group()):
            start, end = at + len(piece) - len(piece.lstrip()), at + len(piece.rstrip())
            if start < end:
                spans.append((start, end))
            at += len(piece)
        if at != line.end():
            raise RuntimeError(f"sentencex's pieces of {line.group()!r} do not add up to it")
    return spans


def cut(sentence: str) -> Span | None:
    """Where to cut a sentence in two, (end of the left part, start of the right): after the clause punctuation
    nearest the middle within its middle half, else across the whitespace nearest the middle, else at the middle
    character (never before a combining mark). None for one character."""
    middle = len(sentence) / 2
    clauses = [(m.start() + 1, m.end()) for m in CLAUSE.finditer(sentence)
               if len(sentence) / 4 <= m.start() + 1 <= 3 * len(sentence) / 4 and m.end() < len(sentence)]
    if clauses:
        return min(clauses, key=lambda c: abs(c[0] - middle))
    spaces = [(m.start(), m.end()) for m in WHITESPACE.finditer(sentence)]
    if spaces:
        return min(spaces, key=lambda c: abs((c[0] + c[1]) / 2 - middle))
    at = len(sentence) // 2
    while 0 < at < len(sentence) and unicodedata.combining(sentence[at]):
        at += 1
    return (at, at) if 0 < at < len(sentence) else None


def fitting_spans(text: str, span: Span, fits: Callable[[str], bool]) -> list[Span]:
    """A sentence's span as pieces that each fit, cut recursively (`cut`); the text between them stays a gap.
    A piece that cannot be cut is left as it is, for the translator to refuse."""
    start, end = span
    if fits(text[start:end]):
        return [span]
    where = cut(text[start:end])
    if where is None:
        return [span]
    left_end, right_start = where
    return fitting_spans(text, (start, start + left_end), fits) + fitting_spans(text, (start + right_start, end), fits)


def wide(char: str) -> bool:
    """A character of a script written without spaces between words or sentences (Chinese, Japanese; full-width)."""
    return unicodedata.east_asian_width(char) in ("W", "F")


@dataclass(frozen=True)
class Document:
    """One text: its sentences and the gaps around them (one more than the sentences)."""

    sentences: tuple[str, ...]
    gaps: tuple[str, ...]

    @property
    def text(self) -> str:
        return self.join(self.sentences)

    def join(self, translations: Sequence[str]) -> str:
        """The translations of its sentences, in order, with its gaps around them."""
        if len(translations) != len(self.sentences):
            raise ValueError(f"{len(translations)} translations for a document of {len(self.sentences)} sentences")
        out = [self.gaps[0]]
        for i, translation in enumerate(translations):
            if i > 0:
                out.append(self.gap(i, translations[i - 1], translation))
            out.append(translation)
        out.append(self.gaps[-1])
        return "".join(out)

    def gap(self, i: int, left: str, right: str) -> str:
        """The gap before sentence i, between two translations: verbatim, but for a space where the source's
        sentences meet without one after a wide character and the translations meet in a spaced script."""
        gap = self.gaps[i]
        if not gap and wide(self.sentences[i - 1][-1]) and left and right and not wide(left[-1]) and not wide(right[0]):
            return " "
        return gap


@dataclass(frozen=True)
class DocumentPlan:
    """How a request's texts became sentences (`sentences`, all texts' in order, as split_documents returns them)
    and how their translations become texts again (`join`)."""

    documents: tuple[Document, ...]

    @classmethod
    def sentences_of(cls, texts: Sequence[str]) -> DocumentPlan:
        """The plan of texts that are each one sentence, as they are (nothing split, no gaps)."""
        return cls(tuple(Document((text,), ("", "")) for text in texts))

    @property
    def sentences(self) -> list[str]:
        return [s for doc in self.documents for s in doc.sentences]

    def parts(self, translations: Sequence) -> list[Sequence]:
        """The translations (one per sentence, in order) of each document."""
        if len(translations) != sum(len(doc.sentences) for doc in self.documents):
            raise ValueError(f"{len(translations)} translations for {len(self.sentences)} sentences")
        out, at = [], 0
        for doc in self.documents:
            out.append(translations[at : at + len(doc.sentences)])
            at += len(doc.sentences)
        return out

    def join(self, translations: Sequence[str]) -> list[str]:
        """Each text's translation: its sentences' translations joined with its gaps."""
        return [doc.join(part) for doc, part in zip(self.documents, self.parts(translations))]

    def join_nbest(self, nbest: Sequence[Sequence[tuple[str, float]]]) -> list[list[tuple[str, float]]]:
        """Each text's hypotheses from its sentences' (text, score) lists: a one-sentence text keeps its n-best, in
        its gaps; a text of several sentences has one, its sentences' best joined, scored by the mean of their
        scores (each a length-normalized log-probability)."""
        out = []
        for doc, part in zip(self.documents, self.parts(nbest)):
            if len(part) == 1:
                out.append([(doc.join([text]), score) for text, score in part[0]])
            elif any(not hyps for hyps in part):
                out.append([])
            else:
                best = [hyps[0] for hyps in part]
                out.append([(doc.join([t for t, _ in best]), sum(s for _, s in best) / len(best))])
        return out


def split_document(text: str, lang: str, fits: Callable[[str], bool]) -> Document:
    """One text as sentences (each line's, by sentencex for `lang`; those that do not fit cut further) and gaps."""
    sentences, gaps, last = [], [], 0
    for span in sentence_spans(text, lang):
        for start, end in fitting_spans(text, span, fits):
            gaps.append(text[last:start])
            sentences.append(text[start:end])
            last = end
    gaps.append(text[last:])
    return Document(tuple(sentences), tuple(gaps))


def split_documents(texts: Sequence[str], lang: str | None, count_tokens: Callable[[str], int],
                    max_tokens: int) -> tuple[list[str], DocumentPlan]:
    """Each text as a document: the sentences of all texts, in order, each of at most `max_tokens` by
    `count_tokens` (a longer one cut further), and the plan that joins their translations back into texts.
    `lang`: the source language, a model's code or a standard one (segmenter_language). An empty text, or one
    that is not text, is a BadInput."""
    segmenter = segmenter_language(lang)
    documents = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise BadInput(f"text {i + 1} is not text")
        if not text.strip():
            raise BadInput(f"text {i + 1} is empty")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates, which neither sentencex nor SentencePiece can take
            raise BadInput(f"text {i + 1} is not valid Unicode text (it holds lone surrogates)") from None
        documents.append(split_document(text, segmenter, lambda s: count_tokens(s) <= max_tokens))
    plan = DocumentPlan(tuple(documents))
    return plan.sentences, plan
