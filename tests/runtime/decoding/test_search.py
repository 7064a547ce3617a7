"""The decoding loop, on the eager reference: strategies agree where they must."""

from __future__ import annotations

import numpy as np
import pytest

import search
from search import SPECIALS, HistorySession
from twostep.errors import BadInput
from twostep.runtime.backends.torch_backend import TorchSession
from twostep.runtime.decoding import kernels

COMMON = dict(specials=SPECIALS, max_new_tokens=10)
SOURCES = [[5, 9, 13, 7, 3], [11, 3], [8, 8, 21, 33, 40, 12, 6, 3]]


def test_batch_of_different_lengths_equals_one_by_one(tiny_model):
    session = TorchSession(tiny_model)
    batched = search.greedy(session, SOURCES, **COMMON)
    assert batched == [search.greedy(session, [s], **COMMON)[0] for s in SOURCES]
    beams = search.beam_search(session, SOURCES, beam_size=3, n_best=2, **COMMON)
    singles = [search.beam_search(session, [s], beam_size=3, n_best=2, **COMMON)[0] for s in SOURCES]
    assert [[h.tokens for h in hyps] for hyps in beams] == [[h.tokens for h in hyps] for hyps in singles]
    for got, want in zip(beams, singles):
        np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-4)


def test_beam_of_one_is_greedy(tiny_model):
    session = TorchSession(tiny_model)
    beams = search.beam_search(session, SOURCES, beam_size=1, **COMMON)
    assert [hyps[0].tokens for hyps in beams] == search.greedy(session, SOURCES, **COMMON)


def test_beam_scores_are_sorted_and_not_worse_than_greedy(tiny_model):
    session = TorchSession(tiny_model)
    greedy = search.beam_search(session, SOURCES, beam_size=1, length_penalty=0.0, **COMMON)
    beams = search.beam_search(session, SOURCES, beam_size=5, n_best=3, length_penalty=0.0, **COMMON)
    for g, hyps in zip(greedy, beams):
        scores = [h.score for h in hyps]
        assert len(hyps) == 3 and scores == sorted(scores, reverse=True)
        assert scores[0] >= g[0].score - 1e-6


def test_suppressed_eos_gives_fixed_length(tiny_model):
    out = search.greedy(TorchSession(tiny_model), SOURCES, suppress_eos=True, **COMMON)
    assert [len(o) for o in out] == [10, 10, 10] and all(3 not in o for o in out)


def test_sampling_is_seeded_and_top_k_1_is_greedy(tiny_model):
    session = TorchSession(tiny_model)
    a = search.sample(session, SOURCES, seed=7, temperature=1.5, **COMMON)
    b = search.sample(session, SOURCES, seed=7, temperature=1.5, **COMMON)
    c = search.sample(session, SOURCES, seed=8, temperature=1.5, **COMMON)
    assert a == b and a != c
    assert search.sample(session, SOURCES, seed=1, top_k=1, **COMMON) == search.greedy(session, SOURCES, **COMMON)
    assert search.sample(session, SOURCES, seed=1, top_p=1e-6, **COMMON) == search.greedy(session, SOURCES, **COMMON)


def test_bad_decoding_options(tiny_model):
    session = TorchSession(tiny_model)
    with pytest.raises(BadInput, match="n_best"):
        search.beam_search(session, SOURCES, beam_size=2, n_best=3, **COMMON)
    with pytest.raises(BadInput, match="temperature"):
        search.sample(session, SOURCES, temperature=0.0, **COMMON)
    with pytest.raises(BadInput, match="empty"):
        search.greedy(session, [[]], **COMMON)


@pytest.mark.parametrize("vocab", [7, 300, 5000])
@pytest.mark.parametrize("rounded", [False, True])
def test_vectorised_beam_search_equals_the_per_sentence_loop_it_replaced(vocab, rounded):
    """The same hypotheses in the same order and bit-identical scores as the old loop (tests/reference_beam.py),
    with ties everywhere when rounded, a vocabulary smaller than the candidates, eos suppressed or not."""
    from reference_beam import beam_search as reference

    sources = [[5 + i % 7] * (1 + i % 5) for i in range(7)]
    for seed, (beam, n_best, penalty, suppress) in enumerate(
            [(4, 1, 1.0, False), (4, 4, 0.6, False), (3, 2, 0.0, True), (1, 1, 1.0, False), (6, 3, 1.0, False)]):
        options = dict(beam_size=beam, n_best=n_best, length_penalty=penalty, suppress_eos=suppress, max_new_tokens=12)
        want = reference(HistorySession(vocab, seed, rounded), sources, bos_id=SPECIALS.bos_id,
                         eos_id=SPECIALS.eos_id, pad_id=SPECIALS.pad_id, **options)
        got = search.beam_search(HistorySession(vocab, seed, rounded), sources, specials=SPECIALS, **options)
        assert [[(h.tokens, h.score) for h in hyps] for hyps in got] == \
            [[(h.tokens, h.score) for h in hyps] for hyps in want]


def test_a_wide_beam_group_splits_its_normalisers_on_a_thread_of_its_own_that_ends_with_it():
    """No module-level pool: the group starts its helper thread once its logits reach PARALLEL_ELEMENTS, and
    it is gone when the decode returns; each sentence decodes as it does alone (no helper)."""
    import threading

    vocab, sources = 40000, [[5 + i, 3] for i in range(8)]
    assert 8 * 4 * vocab >= kernels.PARALLEL_ELEMENTS > 4 * vocab
    session, seen = HistorySession(vocab, 0, False), []
    step = session.step
    session.step = lambda ids: (seen.append([t.name for t in threading.enumerate()]), step(ids))[1]
    got = search.beam_search(session, sources, beam_size=4, n_best=2, specials=SPECIALS, max_new_tokens=3)
    assert any(name.startswith("twostep-beam") for names in seen for name in names)
    assert not any(t.name.startswith("twostep-beam") for t in threading.enumerate())
    alone = [search.beam_search(HistorySession(vocab, 0, False), [s], beam_size=4, n_best=2, specials=SPECIALS,
                                max_new_tokens=3)[0] for s in sources]
    assert [[(h.tokens, h.score) for h in hyps] for hyps in got] == \
        [[(h.tokens, h.score) for h in hyps] for hyps in alone]


class ScriptedSession(HistorySession):
    """Logits scripted by each row's generated tokens (after the source and the start token); uniform elsewhere."""

    def __init__(self, vocab: int, script: dict[tuple[int, ...], dict[int, float]], source_len: int,
                 search_width: int = 0):
        super().__init__(vocab, 0, False)
        self.script, self.skip, self.search_width = script, source_len + 1, search_width

    def step(self, input_ids):
        self.rows = [h + (int(t),) for h, t in zip(self.rows, input_ids[:, 0])]
        out = np.zeros((len(self.rows), self.vocab), np.float32)
        for i, h in enumerate(self.rows):
            for token, logit in self.script.get(h[self.skip:], {}).items():
                out[i, token] = logit
        return out

    def search_step(self, input_ids, need_logits=True):
        """The search outputs as the exported graph gives them: the C best logits (ties to the lower id)."""
        logits = self.step(input_ids)
        ids = np.argsort(-logits, axis=1, kind="stable")[:, : self.search_width]
        top = np.take_along_axis(logits, ids, axis=1)
        log_norm = np.log(np.exp(logits - top[:, :1]).sum(1)).astype(np.float32)
        return dict(logits=logits, top_logits=top, top_ids=ids.astype(np.int64), log_norm=log_norm)


@pytest.mark.parametrize("outputs", [False, True])
def test_transformers_rule_finishes_only_an_eos_among_the_beam_size_best(outputs):
    """Beam 2, step 2's candidates best first: [4, eos], [4, 5], [5, eos], [5, 4]. The n_best rule finishes
    [5] (its eos comes before the second continuing candidate); transformers' rule does not (rank 2 >= the beam
    size), so its second hypothesis is a longer one."""
    from twostep.runtime.decoding import DecodeOptions, decode

    eos, low = SPECIALS.eos_id, -10.0
    script = {(): {4: 2.0, 5: 1.0, eos: low, 1: low, 0: low},
              (4,): {eos: 5.0, 5: 4.5, 4: low, 1: low, 0: low},
              (5,): {eos: 4.0, 4: 3.0, 5: low, 1: low, 0: low}}
    source = [9]
    results = {}
    for rule in ("n_best", "transformers"):
        options = DecodeOptions(beam_size=2, n_best=2, beam_stop=rule)
        session = ScriptedSession(6, script, len(source), search_width=4 if outputs else 0)
        hyps = decode(session, [source], options, specials=SPECIALS, max_new_tokens=3, group=search.Beam)[0]
        results[rule] = [h.tokens for h in hyps]
    assert results["n_best"] == [[4], [5]]
    assert results["transformers"][0] == [4] and [5] not in results["transformers"], results


def test_a_forced_token_scores_zero_on_the_search_outputs_as_on_the_logits():
    """A forced token (a target-language token) is the row's only candidate, log-probability 0, on either path:
    beam scores from the search outputs equal those from the full logits."""
    from twostep.runtime.decoding import DecodeOptions, decode

    eos = SPECIALS.eos_id
    script = {(): {5: 3.0, 4: 1.0}, (4,): {5: 2.0, eos: 1.0}, (4, 5): {eos: 2.5, 4: 1.0}}
    runs = []
    for width in (0, 4):
        session = ScriptedSession(6, script, 1, search_width=width)
        hyps = decode(session, [[9]], DecodeOptions(beam_size=2, n_best=2), specials=SPECIALS, max_new_tokens=5,
                      group=search.Beam, prefixes=[[4]])[0]
        runs.append([(h.tokens, h.score) for h in hyps])
    assert len(runs[0]) == 2
    assert [t for t, _ in runs[1]] == [t for t, _ in runs[0]]
    np.testing.assert_allclose([s for _, s in runs[1]], [s for _, s in runs[0]], rtol=0, atol=1e-6)


def scripted_beam(script: dict, options, max_new_tokens: int, outputs: bool) -> tuple[list, int]:
    """Beam search over a ScriptedSession on the source [9]: (tokens, score) of each hypothesis, and the steps."""
    from twostep.runtime.decoding import decode

    session = ScriptedSession(6, script, 1, search_width=4 if outputs else 0)
    hyps = decode(session, [[9]], options, specials=SPECIALS, max_new_tokens=max_new_tokens, group=search.Beam)[0]
    return [(h.tokens, h.score) for h in hyps], len(session.rows[0]) - 1  # the source, then a token a step


@pytest.mark.parametrize("outputs", [False, True])
def test_ctranslate2_rule(outputs):
    """CTranslate2's BeamSearch, beam 2, on hand-made logits (token 2 has logit 0 where a row leaves it out).
    Step 2's candidates, best first: [4, eos], [4, 5], [5, eos], [5, 4]. [4, eos] (rank 0) finishes; [5, eos]
    (rank 2, past the beam) finishes nothing, and the next non-eos candidate past the beam, [5, 4], takes the
    ended slot. One finished hypothesis < beam 2: on to step 3, the limit, where the two best candidates both
    finish without an eos ([5, 4, 0] from the refilled slot). Scores: log-probability / length ** penalty, the
    length counting the eos: [4] scores (log p(4) + log p(eos | 4)) / 2."""
    from twostep.runtime.decoding import DecodeOptions

    eos, low = SPECIALS.eos_id, -10.0
    script = {(): {4: 2.0, 5: 1.0, eos: low, 1: low, 0: low},
              (4,): {eos: 5.0, 5: 4.5, 4: low, 1: low, 0: low},
              (5,): {eos: 4.0, 4: 3.0, 5: low, 1: low, 0: low},
              (5, 4): {0: 6.0}}
    step1 = 2.0 - np.log(np.exp([2.0, 1.0, 0.0]).sum() + 3 * np.exp(low))
    step2 = 5.0 - np.log(np.exp([5.0, 4.5, 0.0]).sum() + 3 * np.exp(low))
    rule = dict(beam_size=2, beam_stop="ctranslate2")
    hyps, steps = scripted_beam(script, DecodeOptions(n_best=2, length_penalty=1.0, **rule), 3, outputs)
    assert [t for t, _ in hyps] == [[4], [5, 4, 0]] and steps == 3, hyps
    assert hyps[0][1] == pytest.approx((step1 + step2) / 2, abs=1e-6)
    assert hyps[1][1] < hyps[0][1]
    # the n_best rule finishes [5] at rank 2
    assert [t for t, _ in scripted_beam(script, DecodeOptions(beam_size=2, n_best=2), 3, outputs)[0]] == [[4], [5]]
    # length_penalty 0: done once the best candidate has ended and n_best (1) are finished: at step 2
    hyps, steps = scripted_beam(script, DecodeOptions(length_penalty=0.0, **rule), 10, outputs)
    assert hyps == [([4], pytest.approx(step1 + step2, abs=1e-6))] and steps == 2
    hyps, steps = scripted_beam(script, DecodeOptions(length_penalty=1.0, **rule), 10, outputs)
    assert steps > 2  # one finished hypothesis, not the beam's two: on it goes
    # both of step 2's best candidates end: beam 2 finished hypotheses, done there, far from the limit
    ending = {(): script[()], (4,): {eos: 8.0, 5: low, 4: low, 1: low, 0: low},
              (5,): {eos: 8.0, 5: low, 4: low, 1: low, 0: low}}
    hyps, steps = scripted_beam(ending, DecodeOptions(n_best=2, length_penalty=1.0, **rule), 10, outputs)
    assert [t for t, _ in hyps] == [[4], [5]] and steps == 2


@pytest.mark.parametrize("outputs", [False, True])
def test_ctranslate2_rule_remembers_that_a_best_candidate_ended(outputs):
    """length_penalty 0, n_best 2: CTranslate2's top_beam_finished is sticky. Step 2's best candidate [4, eos]
    ends (one finished: on); step 3's best, [4, 5, 4], goes on but the second, [4, 5, eos], ends: two finished and
    a best candidate ended at some step, so the sentence is done at step 3, not at the limit."""
    from twostep.runtime.decoding import DecodeOptions

    eos, low = SPECIALS.eos_id, -10.0
    script = {(): {4: 2.0, 5: 1.0, eos: low, 1: low, 0: low},
              (4,): {eos: 5.0, 5: 4.5, 4: low, 1: low, 0: low},
              (5,): {4: 3.0, eos: low, 5: low, 1: low, 0: low},
              (4, 5): {4: 5.0, eos: 4.5, 5: low, 1: low, 0: low}}  # (5, 4): uniform, below both
    options = DecodeOptions(beam_size=2, n_best=2, length_penalty=0.0, beam_stop="ctranslate2")
    hyps, steps = scripted_beam(script, options, 10, outputs)
    assert [t for t, _ in hyps] == [[4], [4, 5]] and steps == 3, (hyps, steps)


def test_min_new_tokens_takes_eos_out_of_the_first_steps():
    """eos is no candidate, and out of the softmax, until min_new_tokens are generated (CTranslate2's
    min_decoding_length)."""
    from twostep.runtime.decoding import DecodeOptions, decode

    eos = SPECIALS.eos_id
    script = {(): {eos: 9.0, 4: 1.0}, (4,): {eos: 9.0}}
    options = dict(beam_size=2, length_penalty=0.0, beam_stop="ctranslate2")
    assert scripted_beam(script, DecodeOptions(**options), 5, False)[0][0][0] == []
    hyps, _ = scripted_beam(script, DecodeOptions(min_new_tokens=1, **options), 5, False)
    first = 1.0 - np.log(np.exp(1.0) + 4)  # 5 tokens in the softmax: not eos
    second = 9.0 - np.log(np.exp(9.0) + 5)
    assert hyps[0] == ([4], pytest.approx(first + second, abs=1e-6))
    for min_new, want in ((0, []), (1, [4])):
        out = decode(ScriptedSession(6, script, 1), [[9]], DecodeOptions(min_new_tokens=min_new), specials=SPECIALS,
                     max_new_tokens=5)
        assert out[0][0].tokens == want


@pytest.mark.parametrize("outputs", [False, True])
def test_transformers_early_stopping_rules(outputs):
    """Beam 2, length_penalty 1. Step 1 finishes [] (rank 1, -1.31); step 2 finishes [4] (rank 1, -1.29 / 2), and
    [4, 5] lives on (-0.79). With early_stopping true ("transformers_early") two finished hypotheses are enough:
    done, [4] best. With false ("transformers") [4, 5] at its current length (-0.79 / 2) could still beat the
    worst finished one: step 3 finishes [4, 5] (-0.79 / 3), the best, and [4, 5, 5] (-2.9 / 3) cannot beat [4]:
    done. With "never" it is scored at the limit instead (-2.9 / 10) and runs on, through rows of equal logits
    (-1.8 a token), until the best live one scored so cannot beat [4] either: at step 5 (-6.5 / 10)."""
    from twostep.runtime.decoding import DecodeOptions

    eos, low = SPECIALS.eos_id, -10.0
    others = {0: low, 1: low, 2: low}
    script = {(): {eos: 1.0, 4: 2.0, 5: low, **others}, (4,): {eos: 2.0, 5: 2.5, 4: low, **others},
              (4, 5): {eos: 5.0, 5: 3.0, 4: low, **others}}
    runs = {rule: scripted_beam(script, DecodeOptions(beam_size=2, beam_stop=rule), 10, outputs)
            for rule in ("transformers_early", "transformers", "transformers_never")}
    assert runs["transformers_early"][0][0][0] == [4] and runs["transformers_early"][1] == 2, runs
    assert runs["transformers"][0][0][0] == [4, 5] and runs["transformers"][1] == 3, runs
    assert runs["transformers_never"][0] == runs["transformers"][0] and runs["transformers_never"][1] == 5, runs
    # length_penalty 0: the current length and the limit score alike; below 0 transformers scores the best live one
    # at its current length, where it scores best
    for penalty in (0.0, -1.0):
        flat = DecodeOptions(beam_size=2, length_penalty=penalty, beam_stop="transformers_never")
        assert scripted_beam(script, flat, 10, outputs) == scripted_beam(
            script, DecodeOptions(beam_size=2, length_penalty=penalty, beam_stop="transformers"), 10, outputs)
    # early_stopping true at the limit: a sentence that fills up at that step still takes its live beams, [4, 5]
    at_limit = scripted_beam(script, DecodeOptions(beam_size=2, beam_stop="transformers_early"), 2, outputs)
    assert at_limit[0][0][0] == [4, 5], at_limit


def test_no_repeat_ngram_size_bans_repeats_of_the_start_token_and_tokens_but_not_a_forced_one():
    """transformers' n-grams start at the decoder's start token (SPECIALS' bos 2): with n = 1 the start token
    and every token already generated are banned, except at a forced step (the forced token wins). With n = 2,
    4 5 4 cannot go on with 5. Greedy and beam search alike; eos stays in the softmax."""
    from twostep.runtime.decoding import DecodeOptions, decode

    eos, start = SPECIALS.eos_id, SPECIALS.bos_id

    def row(**logits):  # the rest far below: beam search's second beam stays out of the way
        return {i: logits.get(f"t{i}", -10.0) for i in range(6)}
    script = {(): row(t2=5.0, t4=1.0), (4,): row(t4=5.0, t3=1.0), (start,): row(t2=5.0, t4=1.0),
              (start, 4): row(t4=5.0, t3=1.0)}
    for beam in (1, 2):
        def tokens(n, prefix=None):
            options = DecodeOptions(beam_size=beam, no_repeat_ngram_size=n, beam_stop="transformers")
            out = decode(ScriptedSession(6, script, 1), [[9]], options, specials=SPECIALS, max_new_tokens=4,
                         prefixes=[prefix] if prefix else None)
            return out[0][0].tokens
        assert tokens(0)[0] == start
        assert tokens(1) == [4]
        assert tokens(1, [start]) == [4]  # the forced start token, then as above
    cycle = {(): {4: 5.0}, (4,): {5: 5.0}, (4, 5): {4: 5.0}, (4, 5, 4): {5: 5.0, eos: 4.0}}
    for beam in (1, 2):
        options = DecodeOptions(beam_size=beam, no_repeat_ngram_size=2, beam_stop="transformers")
        out = decode(ScriptedSession(6, cycle, 1), [[9]], options, specials=SPECIALS, max_new_tokens=6)
        assert out[0][0].tokens == [4, 5, 4]
    # the bans need the full logits: a session with search outputs gives the same
    for beam in (1, 2):
        options = DecodeOptions(beam_size=beam, no_repeat_ngram_size=2, beam_stop="transformers")
        assert decode(ScriptedSession(6, cycle, 1, search_width=4), [[9]], options, specials=SPECIALS,
                      max_new_tokens=6)[0][0].tokens == [4, 5, 4]
