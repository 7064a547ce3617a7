"""Translator.replace_unknowns (twostep/runtime/translator.py) on a scripted alignment: which row of the alignment
an <unk> reads (after a forced target prefix), and which source positions it may pick (the sentence's own pieces:
not its language tokens, not its suffix). test_ct2.py holds it against CTranslate2 on a real model, where there is
no prefix, no language token and no suffix to get wrong."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from search import SPECIALS
from twostep.artifact.tokenizer import Languages, TargetLanguage
from twostep.runtime.decoding import DecodeOptions, Hypothesis
from twostep.runtime.tokenizer import Tokenizer
from twostep.runtime.translator import Limits, Translator

DEMO_SPM = Path(__file__).parents[2] / "twostep" / "demo" / "model" / "tokenizer.model"
UNK, EOS, BOS = SPECIALS.unk_id, SPECIALS.eos_id, SPECIALS.bos_id
EN, TO_FR, FR = 20, 21, 22  # the source language's token, the target's in the source (Marian's), its forced one
A, B, C, X, Y = 10, 11, 12, 13, 14
SOURCE = [EN, TO_FR, A, B, C, EOS]


class ScriptedAlignment:
    """The alignment a row of targets gives: where each fed token (the one before the token predicted) attends,
    0.5 there; the language tokens and the suffix get 0.9 everywhere, more than any piece of the sentence."""

    def __init__(self, attends: dict[int, int]):
        self.attends = attends

    def alignment(self, input_ids, attention_mask, targets):
        out = np.zeros((*targets.shape, input_ids.shape[1]), np.float32)
        out[:, :, [0, 1, len(SOURCE) - 1]] = 0.9
        for n, row in enumerate(targets):
            for t, fed in enumerate(row):
                out[n, t, self.attends.get(int(fed), 2)] = 0.5
        return out


def translator(attends: dict[int, int]) -> Translator:
    plain = Tokenizer.sentencepiece(DEMO_SPM)
    languages = Languages(source={"en": (EN,)}, target={"fr": TargetLanguage(source=(TO_FR,), decoder=(FR,))})
    tokenizer = Tokenizer(DEMO_SPM.parent, dataclasses.replace(plain.spec, languages=languages,
                                                                 source_suffix=(EOS,)))
    return Translator(ScriptedAlignment(attends), Limits(SPECIALS, 256, 128, 128), tokenizer)


def test_an_unknown_takes_the_piece_its_row_attends_among_the_sentences_own():
    """[X, unk, Y] after the forced FR: the alignment is fed [start, FR, X, unk]; the <unk> is predicted at row 2,
    fed X, which attends C most among the sentence's pieces (a language token and the suffix score higher)."""
    t = translator({X: 4, FR: 3, BOS: 2})
    hyps = [[Hypothesis([X, UNK, Y], -1.0)]]
    got = t.replace_unknowns([SOURCE], hyps, DecodeOptions(replace_unknowns=True), [[FR]])
    assert got[0][0].replacements == ((1, t.tokenizer.source_piece(C)),)
    assert t.tokenizer.source_piece(C) not in {t.tokenizer.source_piece(i) for i in (A, B, EN, TO_FR, EOS)}
    # the option off: nothing replaced
    assert t.replace_unknowns([SOURCE], hyps, DecodeOptions(), [[FR]])[0][0].replacements == ()
