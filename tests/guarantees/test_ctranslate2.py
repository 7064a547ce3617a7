"""beam_stop="ctranslate2" decodes as CTranslate2 itself: the tiny Marian model (tests/hf_models.py, its start
embedding zeroed as CTranslate2 assumes) converted by CTranslate2's own TransformersConverter and imported by
twostep from the same transformers directory, decoded by both: the same tokens, and scores within SCORE_ATOL, in
beam search (length penalties 0.2, 0 with its early exit, 1; n_best; a max length that cuts hypotheses: the last
step's rule) and greedy search.

What the conversion does that twostep's import does differently, and why they agree anyway: CTranslate2 drops
Marian's pad (the last token) from the vocabulary, twostep keeps it as an id it never generates, which the
ctranslate2 rule leaves out of the softmax; CTranslate2 starts the decoder from a zero embedding (its config's
decoder_start_token, </s>, is not embedded), transformers and twostep embed pad, here a zero row."""

from __future__ import annotations

import json

import numpy as np
import pytest

import hf_models
from twostep.runtime.decoding import DecodeOptions
from twostep.runtime.translator import open_translator

SENTENCES = hf_models.TEST_SENTENCES + hf_models.SOURCE_TEXT + ["the the the cat", "dog", "park mat fox zebra over"]
SCORE_ATOL = 1e-5  # CTranslate2 sums float32 log-probabilities, twostep float64: ~3e-6 apart after 40 steps
CASES = [  # beam, length_penalty, max_new_tokens (max_decoding_length), n_best (num_hypotheses)
    (4, 0.2, 40, 1), (4, 0.0, 40, 1), (4, 1.0, 40, 1), (4, 0.2, 40, 2), (4, 0.2, 4, 2), (4, 0.0, 3, 3),
    (2, 0.2, 40, 1), (1, 0.2, 40, 1), (1, 0.2, 3, 1),
]


@pytest.fixture(scope="module")
def models(ct2_models, tmp_path_factory):
    """(CTranslate2's Translator, twostep's Translator, the Marian vocabulary) of one model: the session's Marian
    (ct2_models: its start embedding zeroed, converted by TransformersConverter) imported from transformers."""
    ctranslate2 = pytest.importorskip("ctranslate2", reason="the reference is CTranslate2 itself")
    from twostep.exporter.export import export
    from twostep.model.hf import import_hf_directory

    root = tmp_path_factory.mktemp("ct2-marian-hf")
    hf = ct2_models.marian_hf
    assert json.loads((ct2_models.marian / "config.json").read_text())["decoder_start_token"] == "</s>"
    import_hf_directory(hf, root / "ckpt")
    export(root / "ckpt", root / "art")
    translator, backend = open_translator(root / "art")
    with backend:
        yield (ctranslate2.Translator(str(ct2_models.marian), compute_type="float32"), translator,
               json.loads((hf / "vocab.json").read_text()))


def decode_both(models, beam: int, penalty: float, limit: int, n_best: int, rule: str = "ctranslate2",
                min_new_tokens: int = 1) -> tuple[list, list]:
    """Each sentence's hypotheses (tokens, score) from CTranslate2 and from twostep; CTranslate2's
    min_decoding_length is its default, 1, unless min_new_tokens says otherwise."""
    ct2, translator, vocab = models
    piece = {i: p for p, i in vocab.items()}
    ids = translator.encode(SENTENCES, tgt_lang="fra")
    results = ct2.translate_batch([[piece[i] for i in s] for s in ids], beam_size=beam, length_penalty=penalty,
                                  max_decoding_length=limit, min_decoding_length=min_new_tokens,
                                  num_hypotheses=n_best, return_scores=True)
    want = [[([vocab[p] for p in h], s) for h, s in zip(r.hypotheses, r.scores)] for r in results]
    options = DecodeOptions(beam_size=beam, length_penalty=penalty, max_new_tokens=limit, n_best=n_best,
                            beam_stop=rule, min_new_tokens=min_new_tokens)
    got = [[(h.tokens, h.score) for h in hyps] for hyps in translator.decode_ids(ids, options)]
    return got, want


@pytest.mark.parametrize(("beam", "penalty", "limit", "n_best"), CASES)
def test_decodes_ctranslate2_tokens_and_scores(models, beam, penalty, limit, n_best):
    got, want = decode_both(models, beam, penalty, limit, n_best)
    assert [[t for t, _ in hyps] for hyps in got] == [[t for t, _ in hyps] for hyps in want]
    if limit < 10:
        assert any(len(t) == limit for hyps in got for t, _ in hyps), "the limit should cut some hypotheses"
    if beam > 1:  # greedy search scores nothing in twostep
        np.testing.assert_allclose([s for hyps in got for _, s in hyps], [s for hyps in want for _, s in hyps],
                                   rtol=0, atol=SCORE_ATOL)


def test_min_new_tokens_0_is_min_decoding_length_0(models):
    """eos allowed at the first step: the same tokens again, and not those of min_new_tokens 1."""
    got, want = decode_both(models, 4, 0.2, 40, 1, min_new_tokens=0)
    tokens = [[t for t, _ in hyps] for hyps in got]
    assert tokens == [[t for t, _ in hyps] for hyps in want]
    assert tokens != [[t for t, _ in hyps] for hyps in decode_both(models, 4, 0.2, 40, 1)[0]]


def test_the_rule_matters(models):
    """twostep's n_best rule decodes some sentence differently from CTranslate2: the comparison has teeth."""
    got, want = decode_both(models, 4, 1.0, 40, 1, rule="n_best")
    assert [[t for t, _ in hyps] for hyps in got] != [[t for t, _ in hyps] for hyps in want]
