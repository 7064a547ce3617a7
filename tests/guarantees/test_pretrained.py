"""Pretrained families (twostep/model/hf/): a Marian model with a shared vocabulary (translating with a >>fra<<
token), one with separate vocabularies, an M2M100 model (en -> fr), NLLB models in both tokenizer layouts
(eng_Latn -> fra_Latn) and an mBART-50 model (en_XX -> fr_XX), each built by transformers itself,
imported, exported, and decoded by twostep: exactly transformers' generate() tokens and text, greedy and beam 4
(with transformers' stopping rule, which an imported model decodes with unless told otherwise), on both of
ort-cpu's decoders and through the CLI; the generation config's decoding settings (early_stopping,
no_repeat_ngram_size, ...) decoded as generate() decodes them. The server's and the C++ library's parity are in
tests/serving and tests/cpp, on the same models."""

from __future__ import annotations

import numpy as np
import pytest

import hf_models
from cli_helpers import twostep
from conftest import NEW_TOKENS, ONLY_MBART50, SCORE_ATOL
from twostep.runtime.decoding import DecodeOptions
from twostep.runtime.translator import open_translator

SENTENCES = hf_models.TEST_SENTENCES


def translate(pretrained, options: DecodeOptions | dict, with_scores: bool = False, **backend_options) -> tuple:
    """(tokens, texts, the decoder it decoded with[, the best hypotheses' scores]) of twostep on the artifact's
    ort-cpu backend; `options` a dict: those over the model's decoding defaults."""
    translator, backend = open_translator(pretrained.art, options=options, **backend_options)
    with backend:
        langs = pretrained.langs
        hyps = translator.decode_ids(translator.encode(SENTENCES, **langs), tgt_lang=langs.get("tgt_lang"))
        out = [h[0].tokens for h in hyps], translator.best_texts(hyps), backend.decoder
        return (*out, [h[0].score for h in hyps]) if with_scores else out


def test_greedy_decodes_transformers_tokens_and_text_on_both_decoders(pretrained):
    want_tokens, want_texts = pretrained.greedy
    assert any(len(t) < NEW_TOKENS for t in want_tokens), "the test model should end some sentences at eos"
    assert len({tuple(t) for t in want_tokens}) > len(SENTENCES) // 2, "the test model's outputs should vary"
    options = DecodeOptions(max_new_tokens=NEW_TOKENS)
    tokens, texts, decoder = translate(pretrained, options)
    assert decoder == "decoder_inplace"  # a default export: ort-cpu decodes with the in-place decoder
    assert tokens == want_tokens
    assert texts == want_texts
    tokens, texts, decoder = translate(pretrained, options, kv_cache="concat")
    assert decoder == "decoder"
    assert (tokens, texts) == (want_tokens, want_texts)


def test_beam_search_decodes_transformers_tokens_and_text_by_default(pretrained):
    """transformers keeps beam_size finished hypotheses before it stops; twostep's own rule (n_best) stops once
    the best finished one cannot be beaten at the current length, so it may stop earlier with another best:
    beam_stop="transformers" reproduces transformers' rule (docs/models.md), and an imported model records it in
    its decoding defaults, so that a beam of 4 and nothing else decodes as generate(num_beams=4). The best
    hypotheses' scores equal transformers' sequences_scores to SCORE_ATOL."""
    tokens, texts, _, scores = translate(pretrained, {"beam_size": 4, "max_new_tokens": NEW_TOKENS}, with_scores=True)
    assert (tokens, texts) == pretrained.beam
    assert np.allclose(scores, pretrained.beam_scores, rtol=0, atol=SCORE_ATOL), (scores, pretrained.beam_scores)
    if pretrained.name == "madlad":  # where twostep's own rule finds another best
        own = translate(pretrained, {"beam_size": 4, "max_new_tokens": NEW_TOKENS, "beam_stop": "n_best"})
        assert own[1] != texts


@ONLY_MBART50
def test_mbart50_without_tokenizer_json_decodes_transformers_tokens_and_text(mbart50_hub):
    """The hub's mBART-50 layout (sentencepiece.bpe.model, no tokenizer.json), its ids numbered as MBart50Tokenizer
    numbers them: greedy and beam 4 decode transformers' generate() on that directory, to the last token."""
    assert not (mbart50_hub.hf / "tokenizer.json").exists()
    assert any(len(t) < NEW_TOKENS for t in mbart50_hub.greedy[0]), "the test model should end some sentences at eos"
    tokens, texts, _ = translate(mbart50_hub, DecodeOptions(max_new_tokens=NEW_TOKENS))
    assert (tokens, texts) == mbart50_hub.greedy
    options = DecodeOptions(beam_size=4, max_new_tokens=NEW_TOKENS, beam_stop="transformers")
    tokens, texts, _, scores = translate(mbart50_hub, options, with_scores=True)
    assert (tokens, texts) == mbart50_hub.beam
    assert np.allclose(scores, mbart50_hub.beam_scores, rtol=0, atol=SCORE_ATOL), (scores, mbart50_hub.beam_scores)


def test_the_cli_translates_text_with_languages_as_transformers_does(pretrained):
    """Greedy, and `--beam 4` alone: generate(num_beams=4)'s text (the artifact's decoding defaults say
    transformers' rule)."""
    langs = [arg for key, flag in (("src_lang", "--src-lang"), ("tgt_lang", "--tgt-lang"))
             if key in pretrained.langs for arg in (flag, pretrained.langs[key])]
    result = twostep("translate", pretrained.art, *SENTENCES, "--max-new-tokens", NEW_TOKENS, *langs)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == pretrained.greedy[1]
    result = twostep("translate", pretrained.art, *SENTENCES, "--max-new-tokens", NEW_TOKENS, "--beam", 4, *langs)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == pretrained.beam[1]


def test_sentences_to_different_languages_share_a_batch(pretrained):
    """M2M100's, NLLB's and mBART-50's target language is a token forced after the decoder's start, one per row;
    MADLAD's a token before each source: a batch of sentences to two languages decodes each as transformers does
    alone."""
    if pretrained.other_target is None:
        pytest.skip("one target language per model: a second one is M2M100's, NLLB's, mBART-50's and MADLAD's")
    src, french, german = pretrained.langs.get("src_lang"), pretrained.langs["tgt_lang"], pretrained.other_target
    german = hf_models.reference(pretrained.hf, SENTENCES, NEW_TOKENS, src_lang=src, tgt_lang=german)
    translator, backend = open_translator(pretrained.art, options=DecodeOptions(max_new_tokens=NEW_TOKENS))
    with backend:
        french_ids = translator.encode(SENTENCES, src, french)
        german_ids = translator.encode(SENTENCES, src, pretrained.other_target)
        sources = [ids for pair in zip(french_ids, german_ids) for ids in pair]
        prefixes = [translator.prefix(lang) for _ in SENTENCES for lang in (french, pretrained.other_target)]
        assert prefixes[0] != prefixes[1] or sources[0] != sources[1]  # forced on the decoder, or in the source
        hyps = translator.decode_ids(sources, prefixes=prefixes)
    tokens = [h[0].tokens for h in hyps]
    assert tokens[0::2] == pretrained.greedy[0]
    assert tokens[1::2] == german[0]


def test_the_imported_model_computes_transformers_logits(pretrained):
    """Teacher-forced over transformers' own greedy output, twostep's eager model gives transformers' logits at
    every position to 1e-4: a position table read one row off (M2M100's pad + 1 offset, mBART's 2), a missing
    bias or norm moves them far more."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from twostep.model.checkpoint import load_checkpoint
    from twostep.runtime.tokenizer import Tokenizer

    ckpt = load_checkpoint(pretrained.ckpt)
    theirs = AutoModelForSeq2SeqLM.from_pretrained(pretrained.hf).eval()
    tokenizer = Tokenizer.load(pretrained.ckpt, ckpt.tokenizer)
    spec = ckpt.tokenizer
    start = [ckpt.config.start_id, *spec.decoder_prefix(pretrained.langs.get("tgt_lang"))]
    for text, tokens in zip(SENTENCES[:4], pretrained.greedy[0]):
        src = torch.tensor([tokenizer.encode_source(text, **pretrained.langs)])
        tgt = torch.tensor([start + tokens])
        mask = torch.ones_like(src)
        with torch.no_grad():
            want = theirs(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
            got = ckpt.model(src, mask, tgt)
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), float((got - want).abs().max())


STANDARD_CODES = {"marian": {"tgt_lang": "fr"}, "marian-separate": {},
                  "m2m100": {"src_lang": "eng", "tgt_lang": "fra"},
                  "nllb": {"src_lang": "en-US", "tgt_lang": "fr-FR"},
                  "nllb-json": {"src_lang": "en", "tgt_lang": "fre"},
                  "mbart50": {"src_lang": "en-GB", "tgt_lang": "fr"}, "t5": {},
                  "madlad": {"tgt_lang": "fra"}}


def test_standard_language_codes_mean_the_models_own(pretrained):
    """ISO 639-1/639-3 codes and BCP-47 tags are resolved to each family's own codes (eng_Latn, en_XX, __fr__'s
    fr, >>fra<<'s fra): the same source ids and forced tokens, and through the CLI the same translation."""
    standard = STANDARD_CODES[pretrained.name]
    translator, backend = open_translator(pretrained.art)
    with backend:
        assert translator.encode(SENTENCES, **standard) == translator.encode(SENTENCES, **pretrained.langs)
        if "tgt_lang" in standard:
            assert translator.prefix(standard["tgt_lang"]) == translator.prefix(pretrained.langs["tgt_lang"])
    if pretrained.name == "nllb":
        result = twostep("translate", pretrained.art, *SENTENCES, "--max-new-tokens", NEW_TOKENS, "--src-lang", "en",
                         "--tgt-lang", "fr")
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == pretrained.greedy[1]


# generation_config.json settings on the session's M2M100 model (its target language forced after a start token that
# is eos), each of which generate() decodes differently from the settings' defaults there: (settings, the options
# that undo them). The neutral values of settings twostep does not run (do_sample false, repetition_penalty 1) are
# taken.
GENERATION = {
    "early_stopping": ({"num_beams": 5, "early_stopping": True, "max_length": 21, "do_sample": False,
                        "repetition_penalty": 1.0}, {"beam_stop": "transformers"}),
    "never": ({"num_beams": 4, "early_stopping": "never", "length_penalty": 3.0, "max_length": 41},
              {"beam_stop": "transformers"}),
    "no_repeat_ngram_size": ({"num_beams": 4, "no_repeat_ngram_size": 1, "max_length": 21},
                             {"no_repeat_ngram_size": 0}),
}


@pytest.mark.parametrize("pretrained", ["m2m100"], indirect=True)
@pytest.mark.parametrize("setting", list(GENERATION))
def test_the_generation_configs_decoding_is_imported_and_decodes_as_generate_does(pretrained, setting, tmp_path):
    """The model imported with its generation config's num_beams, early_stopping (true, "never"), length_penalty,
    max_length and no_repeat_ngram_size recorded as its decoding defaults: translated with no options (the eager
    backend on the checkpoint), it gives generate()'s tokens with no arguments but the language; and the options
    that undo the setting decode something else."""
    import json
    import shutil

    from twostep.model.hf import import_hf_directory

    settings, undo = GENERATION[setting]
    hf = tmp_path / "hf"
    shutil.copytree(pretrained.hf, hf, ignore=shutil.ignore_patterns("src"))
    generation = json.loads((hf / "generation_config.json").read_text())
    (hf / "generation_config.json").write_text(json.dumps({**generation, **settings}))
    ckpt = import_hf_directory(hf, tmp_path / "ckpt")
    assert ckpt.info["decoding"]["max_new_tokens"] == settings["max_length"] - 1  # max_length counts the start
    want = hf_models.reference(hf, SENTENCES, None, beams=None, **pretrained.langs)[0]
    translator, backend = open_translator(ckpt.path)
    with backend:
        sources = translator.encode(SENTENCES, **pretrained.langs)
        hyps = translator.decode_ids(sources, tgt_lang=pretrained.langs["tgt_lang"])
        other = translator.decode_ids(sources, translator.options_with(**undo), tgt_lang=pretrained.langs["tgt_lang"])
    assert [h[0].tokens for h in hyps] == want
    assert [h[0].tokens for h in other] != want


@pytest.mark.parametrize("beam", [1, 4])
def test_a_glossary_constrains_the_sentence_it_matches_and_leaves_the_others_byte_identical(pretrained, beam):
    """A glossary whose term is found in one sentence only ("cat": not in "cats"): every other sentence's text is
    translate()'s to the byte, greedy and at the model's default beam, in one batch with the constrained one;
    that one holds the target term (a word of another sentence's translation), or says it does not."""
    from twostep.runtime.glossary import Entry, Glossary

    langs = pretrained.langs
    translator, backend = open_translator(pretrained.art, options={"beam_size": beam, "max_new_tokens": NEW_TOKENS})
    with backend:
        plain = translator.translate(SENTENCES, **langs)
        words = [w for text in plain[1:] for w in text.split() if w.isalpha() and w not in plain[0]]
        target = max(words, key=len)
        termed = translator.translate_glossary(SENTENCES, Glossary([Entry("cat", (target,))]), **langs)
    assert [t.text for t in termed[1:]] == plain[1:]
    assert all(not t.applied and not t.unmet for t in termed[1:])
    first = termed[0]
    assert [f.entry.source for f in first.applied] == ["cat"] and not first.unmet
    assert target in first.text and first.text != plain[0]


def test_a_target_term_takes_each_tokenization_it_has_in_context(pretrained):
    """The token sequences a target term is constrained to: the term alone (as after a space) and attached to
    what precedes it, each the tokenizer's own tokenization of the term in that context, each decoding to it;
    then the single pieces that hold it whole (none of which is a word-start piece of the term alone)."""
    translator, backend = open_translator(pretrained.art)
    with backend:
        tok = translator.tokenizer
        variants = tok.target_variants("bonjour")
        assert len(set(variants)) == len(variants) >= 2
        alone, attached = (tok.target_spans(text) for text in ("bonjour", "(bonjour"))
        assert variants[0] == tuple(i for i, _, _ in alone)
        assert variants[1] == tuple(i for i, begin, _ in attached if begin >= 1)
        for variant in variants[:2]:
            assert tok.decode(variant).strip() == "bonjour"
        holders = {i for i, text in tok.target_texts() if "bonjour" in text}
        assert set(variants[2:]) == {(i,) for i in holders} - set(variants[:2])
