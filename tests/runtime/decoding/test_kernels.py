"""The numeric kernels of a step (twostep/runtime/decoding/kernels.py): stable argsort prefixes, normalisers
split over threads equal to one pass."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from twostep.runtime.decoding import kernels


def test_top_candidates_is_a_stable_argsort_prefix():
    """The old loop's selection (tests/reference_beam.py), which the vectorised one is held to."""
    from reference_beam import top_candidates

    rng = np.random.default_rng(0)
    for _ in range(50):
        row = rng.integers(-5, 5, 400).astype(np.float64)  # many ties
        row[rng.integers(0, 400, 30)] = -np.inf
        n = int(rng.integers(1, 20))
        np.testing.assert_array_equal(top_candidates(row, n), np.argsort(-row, kind="stable")[:n])


def test_beam_candidates_are_a_stable_argsort_prefix_over_each_sentence():
    rng = np.random.default_rng(1)
    for _ in range(30):
        sentences, k, vocab = int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(2, 900))
        n = int(rng.integers(1, 12))
        logits = rng.integers(-4, 4, (sentences * k, vocab)).astype(np.float32)  # many ties
        scores = rng.integers(-3, 0, (sentences, k)).astype(np.float64)
        scores[rng.random((sentences, k)) < 0.2] = -np.inf
        x = logits.astype(np.float64)
        logp = (x - x.max(-1, keepdims=True)) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
        total = (scores[:, :, None] + logp.reshape(sentences, k, vocab)).reshape(sentences, -1)
        got_total, got_flat = kernels.beam_candidates(logits.copy(), scores, n)
        for j in range(sentences):
            order = np.argsort(-total[j], kind="stable")[:n]
            order = order[total[j, order] > -np.inf]
            np.testing.assert_array_equal(got_flat[j, : len(order)], order)
            np.testing.assert_array_equal(got_total[j, : len(order)], total[j, order])
            assert (got_flat[j, len(order):] == -1).all() and (got_total[j, len(order):] == -np.inf).all()


def test_log_normalisers_of_a_large_batch_split_in_two_threads_are_those_of_one_pass():
    logits = np.random.default_rng(2).standard_normal((37, 40000)).astype(np.float32) * 4
    assert logits.size >= kernels.PARALLEL_ELEMENTS
    with ThreadPoolExecutor(1) as helper:
        top, lse = kernels.row_log_normalisers(logits, helper=helper)
    x = logits.astype(np.float64)
    np.testing.assert_array_equal(top, x.max(-1))
    np.testing.assert_array_equal(lse, np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)))


def test_repeated_ngrams_are_those_transformers_bans():
    """Row by row, the ids NoRepeatNGramLogitsProcessor sets to -inf, for rows of any length (shorter than the
    n-gram too) in one padded array, n from 1."""
    import pytest

    pytest.importorskip("transformers")
    import torch
    from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor

    rng = np.random.default_rng(2)
    vocab = 6
    for n in (1, 2, 3, 4):
        for _ in range(20):
            lengths = rng.integers(1, 14, 5)
            sequences = rng.integers(0, vocab, (5, 14))  # few ids: many repeats
            rows, ids = kernels.repeated_ngrams(sequences, lengths, n)
            for r, length in enumerate(lengths):
                scores = NoRepeatNGramLogitsProcessor(n)(torch.tensor(sequences[r : r + 1, :length]),
                                                         torch.zeros(1, vocab))
                assert set(ids[rows == r].tolist()) == set(np.flatnonzero(np.isinf(scores[0].numpy())).tolist())


def test_banned_ids_stay_in_the_softmax_as_transformers_bans_them():
    """no_repeat_ngram_size's bans are -inf after the log-softmax (transformers' beam search processes the
    log-probabilities): the other candidates' totals are those of the unbanned logits, not renormalised."""
    rng = np.random.default_rng(3)
    sentences, k, vocab, n = 2, 3, 50, 4
    logits = rng.standard_normal((sentences * k, vocab)).astype(np.float32)
    scores = rng.uniform(-3, 0, (sentences, k))
    rows = np.repeat(np.arange(sentences * k), 5)
    ids = rng.integers(0, vocab, rows.size)
    x = logits.astype(np.float64)
    logp = x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
    logp[rows, ids] = -np.inf  # the bans come after the softmax
    total = (scores[:, :, None] + logp.reshape(sentences, k, vocab)).reshape(sentences, -1)
    got_total, got_flat = kernels.beam_candidates(logits.copy(), scores, n, banned=(rows, ids))
    for j in range(sentences):
        order = np.argsort(-total[j], kind="stable")[:n]
        np.testing.assert_array_equal(got_flat[j], order)
        np.testing.assert_allclose(got_total[j], total[j, order], rtol=0, atol=1e-12)
