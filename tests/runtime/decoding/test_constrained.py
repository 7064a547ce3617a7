"""Constrained beam search (issue 50): the vectorised search (ConstrainedBeam) equals its slow reference
(tests/reference_constrained.py) on random constraints; what it promises holds; a sentence without
constraints decodes as it does today, beside constrained ones."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_constrained import constrained_beam, holds, met
from search import SPECIALS, HistorySession
from twostep.errors import BadInput
from twostep.runtime.decoding import DecodeOptions, decode
from twostep.runtime.decoding.constraints import Automaton, Constraints, Table
from twostep.runtime.decoding.search import CONSTRAINED_BEAM

EOS = SPECIALS.eos_id


def logits_of(vocab: int, seed: int, rounded: bool, source: list[int]):
    """A HistorySession's logits for a sentence's generated tokens: the reference sees what the session gives."""
    def f(tokens: tuple[int, ...]) -> np.ndarray:
        h = (*source, SPECIALS.bos_id, *tokens)
        row = np.random.default_rng([seed, len(h), *h]).standard_normal(vocab) * 3
        return (np.round(row) if rounded else row).astype(np.float32)
    return f


token = st.integers(4, 11)
terms = st.lists(st.lists(st.lists(token, min_size=1, max_size=3), min_size=1, max_size=2), min_size=1, max_size=3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), vocab=st.sampled_from([12, 40]), rounded=st.booleans(), seed=st.integers(0, 1000),
       beam=st.sampled_from([1, 2, 4, 5]), penalty=st.sampled_from([0.0, 1.0]), limit=st.integers(3, 10))
def test_the_vectorised_search_equals_the_obvious_one(data, vocab, rounded, seed, beam, penalty, limit):
    """Sentences decoded together, some constrained (1-3 terms of 1-2 variants of 1-3 tokens each), some not:
    each constrained one gives the reference's hypotheses, scores and unmet terms, alone in a loop."""
    sentences = data.draw(st.integers(1, 4))
    sources = [[5 + (seed + i) % 7] * (1 + i) for i in range(sentences)]
    constraints = [data.draw(terms) for _ in sources]
    n_best = data.draw(st.integers(1, max(beam, CONSTRAINED_BEAM)))
    options = DecodeOptions(beam_size=beam, n_best=min(n_best, beam), length_penalty=penalty)
    got = decode(HistorySession(vocab, seed, rounded), sources, options, specials=SPECIALS, max_new_tokens=limit,
                 constraints=[Constraints.of(c) for c in constraints])
    for source, c, hyps in zip(sources, constraints, got):
        want = constrained_beam(logits_of(vocab, seed, rounded, source), c, beam_size=max(beam, CONSTRAINED_BEAM),
                                n_best=options.n_best, length_penalty=penalty, limit=limit, eos_id=EOS)
        assert [(h.tokens, h.score, h.unmet) for h in hyps] == [(h.tokens, h.score, h.unmet) for h in want]
        for h in hyps:  # the promise itself: a hypothesis holds each term, or says which it does not
            assert set(h.unmet) == set(range(len(c))) - met(h.tokens, c)


def test_the_best_output_holds_one_variant_of_each_term_given_room():
    """With room to meet them (the limit grown by the terms' length, as the Translator grows it), the best
    hypothesis holds a variant of each term, greedy or beam; the others of an n-best list either do or say which
    they miss, after every one that meets them all."""
    vocab, sources = 40, [[5, 6, 7], [8, 9], [10]]
    constraints = [[[[20, 21], [30]], [[25]]], [[[33, 34, 35]]], [[[12], [13]], [[14, 15]], [[16]]]]
    for options in (DecodeOptions(), DecodeOptions(beam_size=4, n_best=4)):
        hyps = decode(HistorySession(vocab, 3, False), sources, options, specials=SPECIALS, max_new_tokens=8 + 6,
                      constraints=[Constraints.of(c) for c in constraints])
        for c, sentence in zip(constraints, hyps):
            assert len(sentence) == options.n_best
            assert sentence[0].unmet == () and met(sentence[0].tokens, c) == set(range(len(c)))
            for h in sentence:
                assert set(h.unmet) == set(range(len(c))) - met(h.tokens, c)
            assert [bool(h.unmet) for h in sentence] == sorted(bool(h.unmet) for h in sentence)


def test_a_sentence_without_constraints_decodes_as_it_does_alone_beside_constrained_ones():
    vocab, sources = 40, [[5, 6, 7], [8, 9], [10]]
    for options in (DecodeOptions(), DecodeOptions(beam_size=4, n_best=2)):
        alone = decode(HistorySession(vocab, 1, False), sources[1:2], options, specials=SPECIALS, max_new_tokens=9)
        beside = decode(HistorySession(vocab, 1, False), sources, options, specials=SPECIALS, max_new_tokens=9,
                        constraints=[Constraints.of([[[20]]]), None, Constraints.of([[[21, 22]]])])
        assert [(h.tokens, h.score) for h in beside[1]] == [(h.tokens, h.score) for h in alone[0]]
        assert all(holds(h.tokens, [20]) for h in beside[0])


def test_a_term_out_of_reach_is_reported_unmet_at_the_limit():
    """A term whose token the model never generates (Marian's pad) cannot be met: the sentence runs to its limit,
    its eos blocked, and says which term it misses; the one it met is not among them."""
    specials = dataclasses.replace(SPECIALS, never=(SPECIALS.pad_id,))
    hyps = decode(HistorySession(30, 2, False), [[5, 6]], DecodeOptions(beam_size=2, n_best=2), specials=specials,
                  max_new_tokens=6, constraints=[Constraints.of([[[17]], [[SPECIALS.pad_id]]])])[0]
    assert [h.unmet for h in hyps] == [(1,), (1,)]
    assert all(len(h.tokens) == 6 and holds(h.tokens, [17]) for h in hyps)


def test_terms_are_tracked_after_the_forced_tokens():
    """A forced target-language token equal to a term's token does not meet it: the term is met by a token the
    search chose."""
    hyps = decode(HistorySession(30, 4, False), [[5, 6]], DecodeOptions(beam_size=2), specials=SPECIALS,
                  max_new_tokens=7, prefixes=[[19]], constraints=[Constraints.of([[[19]]])])[0]
    assert holds(hyps[0].tokens, [19])
    assert hyps[0].unmet == ()


def test_bad_constraints():
    with pytest.raises(BadInput, match="at least one token"):
        Constraints.of([[[]]])
    with pytest.raises(BadInput, match="at most 32 terms"):
        Constraints.of([[[i]] for i in range(33)])
    with pytest.raises(BadInput, match="not sampling"):
        decode(HistorySession(30, 0, False), [[5]], DecodeOptions(sampling=True), specials=SPECIALS,
               max_new_tokens=3, constraints=[Constraints.of([[[7]]])])


def test_the_automaton_meets_what_the_tokens_hold():
    """Table.advance over random token streams: the terms met after each token are those whose sequences the
    stream holds; tokens_ahead is the reference's `ahead`."""
    from reference_constrained import ahead

    rng = np.random.default_rng(0)
    for _ in range(200):
        c = [[tuple(rng.integers(4, 8, rng.integers(1, 4))) for _ in range(rng.integers(1, 3))]
             for _ in range(rng.integers(1, 4))]
        table = Table([Automaton(Constraints.of([[[9]]])), Automaton(Constraints.of(c))])  # the second's states
        state, done, stream = np.array([table.offset[1]]), np.array([0]), []
        for t in rng.integers(4, 9, 12):
            stream.append(int(t))
            state = table.advance(state, np.array([t]))
            done = done | table.done[state]
            assert {i for i in range(len(c)) if done[0] >> i & 1} == met(stream, c)
            _, tokens = table.tokens_ahead(state, done)
            assert set(tokens.tolist()) == ahead(stream, c, met(stream, c))
