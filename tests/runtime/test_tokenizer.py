"""twostep/runtime/tokenizer.py: source pieces beside their ids, target text with replacements, and the two ways of
joining target pieces (`detokenize`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from twostep.runtime.tokenizer import Tokenizer

DEMO_SPM = Path(__file__).parents[2] / "twostep" / "demo" / "model" / "tokenizer.model"


def tokenizer(detokenize: str = "sentencepiece") -> Tokenizer:
    plain = Tokenizer.sentencepiece(DEMO_SPM)
    return Tokenizer(DEMO_SPM.parent, dataclasses.replace(plain.spec, detokenize=detokenize))


def test_source_tokens_are_the_ids_with_the_text_of_each_piece():
    tok = tokenizer()
    ids, pieces = tok.source_tokens("three 😀 hundred")
    assert ids == tok.encode_source("three 😀 hundred")
    assert pieces[-1] is None  # the eos suffix is no piece of the text
    assert "😀" in "".join(p for p in pieces if p)  # an unknown piece keeps its own text, its id unk's
    assert ids[[i for i, p in enumerate(pieces) if p and "😀" in p][0]] == tok.spec.unk_id


def test_replacements_stand_for_their_ids_and_argos_joins_as_argostranslate():
    ids = tokenizer().encode_target("three hundred")
    snake = {1: "\u2581snake_case"}  # an <unk> replaced by a source piece
    assert tokenizer().decode(ids) == "three hundred"
    assert tokenizer().decode(ids, snake) == "three snake_case"
    # argostranslate's SentencePieceTokenizer.decode: "▁" and "_" as spaces, one leading space dropped
    assert tokenizer("argos").decode(ids, snake) == "three snake case"
    assert tokenizer("argos").decode(ids[:1], {0: "\u2581\u2581two"}) == " two"  # one space dropped, not all
