"""Translations as they decode: the events a stream gives, and the text deltas of a growing token list.

A stream of a list of sentences gives, per sentence, `Delta`s while it decodes (greedy search and sampling; none
for beam search, whose best hypothesis can change until the end) and one `SentenceDone` when it is done, in the
order sentences finish. A sentence's deltas concatenated are exactly its `SentenceDone.text`, the text that
translate() gives for it. `sentence` indexes the flat list of sentences the stream was given.

`TextDeltas` turns one sentence's growing token list into those deltas with the model's own tokenizer. The text of
a token list's prefix is not always a prefix of the final text: the last token may be half a word, byte-fallback
pieces (<0xE3>) make a character only together (and a tokenizers file's decoder turns a whole run of them into
U+FFFD as long as it is not valid UTF-8), trailing whitespace is stripped at the end but not in the middle. So a
delta holds only text that later tokens cannot change: the text of the tokens before the last one and before
the run of byte pieces (and pieces of no text) that ends there (decode strips its trailing whitespace); the rest
comes when the sentence is done (`finish`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from twostep.runtime.decoding import Hypothesis
from twostep.runtime.documents import DocumentPlan
from twostep.runtime.tokenizer import Tokenizer


@dataclass(frozen=True)
class Delta:
    """Sentence `sentence`'s text grew by `text` (never empty)."""

    sentence: int
    text: str


@dataclass(frozen=True)
class SentenceDone:
    """Sentence `sentence` is done: its best text (what translate() gives; its deltas concatenated) and its
    n-best hypotheses, (text, score) as translate_nbest() gives them; `unmet`: the constraint terms its best
    misses (Hypothesis.unmet)."""

    sentence: int
    text: str
    hypotheses: tuple[tuple[str, float], ...]
    unmet: tuple[int, ...] = ()


@dataclass(frozen=True)
class TextDone:
    """Text `text` (of a stream of documents) is done: its sentences' translations joined with its own whitespace
    and line breaks (DocumentPlan.join), what translate(..., split=True) gives for it."""

    text: int
    translation: str


Event = Delta | SentenceDone | TextDone


class TextEvents:
    """A stream of documents' sentences (DocumentPlan.sentences): `after(event)` gives TextDone for a text once
    its last sentence is done."""

    def __init__(self, plan: DocumentPlan):
        self.plan = plan
        self.owner = [t for t, doc in enumerate(plan.documents) for _ in doc.sentences]  # each sentence's text
        self.first = [sum(len(d.sentences) for d in plan.documents[:t]) for t in range(len(plan.documents))]
        self.left = [len(doc.sentences) for doc in plan.documents]
        self.done: dict[int, str] = {}

    def after(self, event: Event) -> list[TextDone]:
        if not isinstance(event, SentenceDone):
            return []
        self.done[event.sentence] = event.text
        t = self.owner[event.sentence]
        self.left[t] -= 1
        if self.left[t]:
            return []
        doc = self.plan.documents[t]
        return [TextDone(t, doc.join([self.done.pop(self.first[t] + k) for k in range(len(doc.sentences))]))]


class TextDeltas:
    """One sentence's text as its tokens grow (eos and forced tokens left out): `update(tokens so far)` gives
    what is new and cannot change, `finish(final tokens)` the rest. All of them concatenated are decode(final
    tokens)."""

    def __init__(self, tokenizer: Tokenizer, joiners: dict[int, bool] | None = None):
        self.tokenizer = tokenizer
        self.text = ""  # given out so far
        self.joiners = {} if joiners is None else joiners  # joins(token), remembered: a stream's sentences share it

    def update(self, tokens: Sequence[int]) -> str:
        """The text that `tokens` adds to what was given out ('' for none)."""
        end = len(tokens) - 1  # the last token waits: it may be half a word
        while end > 0 and self.joins(int(tokens[end - 1])):
            end -= 1
        text = self.tokenizer.decode(tokens[:end]) if end > 0 else ""
        if len(text) <= len(self.text) or not text.startswith(self.text):
            return ""
        delta, self.text = text[len(self.text) :], text
        return delta

    def finish(self, tokens: Sequence[int]) -> str:
        """The rest of the text, the sentence being done with `tokens`."""
        final = self.tokenizer.decode(tokens)
        if not final.startswith(self.text):
            raise RuntimeError(f"a stream gave out {self.text!r}, which the final text {final!r} does not start with")
        delta, self.text = final[len(self.text) :], final
        return delta

    def joins(self, token: int) -> bool:
        """Whether a token's text can depend on the tokens after it: a byte piece, or a piece without text of
        its own (a special token decode skips) that a run of byte pieces can go on past."""
        known = self.joiners.get(token)
        if known is None:
            known = self.joiners[token] = self.tokenizer.is_byte(token) or not self.tokenizer.decode([token])
        return known


class Events:
    """A stream's events from what a decode reports: `tokens(i, tokens so far)` while sentence i decodes with
    greedy search or sampling (`deltas` true), `done(i, hypotheses)` once it is done."""

    def __init__(self, tokenizer: Tokenizer, deltas: bool = True, joiners: dict[int, bool] | None = None):
        self.tokenizer, self.deltas = tokenizer, deltas
        self.texts: dict[int, TextDeltas] = {}
        self.joiners = {} if joiners is None else joiners  # TextDeltas.joins' memory, shared by streams that pass it

    def tokens(self, sentence: int, tokens: Sequence[int]) -> list[Event]:
        if not self.deltas:
            return []
        if sentence not in self.texts:
            self.texts[sentence] = TextDeltas(self.tokenizer, self.joiners)
        text = self.texts[sentence].update(tokens)
        return [Delta(sentence, text)] if text else []

    def done(self, sentence: int, hypotheses: Sequence[Hypothesis]) -> list[Event]:
        nbest = tuple((self.tokenizer.decode(h.tokens), h.score) for h in hypotheses)
        best = nbest[0][0] if nbest else ""
        events: list[Event] = []
        if self.deltas:
            text = self.texts.pop(sentence, None) or TextDeltas(self.tokenizer, self.joiners)
            rest = text.finish(hypotheses[0].tokens if hypotheses else [])
            events += [Delta(sentence, rest)] if rest else []
        return [*events, SentenceDone(sentence, best, nbest, tuple(hypotheses[0].unmet) if hypotheses else ())]
