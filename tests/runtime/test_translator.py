"""Bad inputs: one clear message naming the input, exit 1, no traceback (twostep/runtime/translator.py)."""

from __future__ import annotations

import pytest

from cli_helpers import assert_user_error, twostep
from twostep.errors import BadInput
from twostep.runtime.translator import open_translator


def test_sentence_longer_than_max_positions(demo_artifact):
    long = " ".join(["seven hundred and seventy-seven thousand"] * 40)
    assert_user_error(twostep("translate", demo_artifact, long, "--no-split"), "sentence 1 has",
                      "at most 128 (max_positions)")
    split = twostep("translate", demo_artifact, long)  # by default cut into pieces that fit (test_documents.py)
    assert split.returncode == 0, split.stderr


def test_empty_input(demo_artifact):
    assert_user_error(twostep("translate", demo_artifact, "one", "   "), "text 2 is empty")
    assert_user_error(twostep("translate", demo_artifact, "   ", "--no-split"), "sentence 1 is empty")
    assert_user_error(twostep("translate", demo_artifact, stdin=""), "no input")


def test_token_ids_outside_the_vocabulary(demo_artifact):
    assert_user_error(twostep("translate", demo_artifact, "--ids", "5 9999 3"),
                      "sentence 1 has token ids outside the vocabulary [0, 256): [9999]")
    assert_user_error(twostep("translate", demo_artifact, "--ids", "5 x 3"), "is not a list of token ids")
    translator, backend = open_translator(demo_artifact, "ort-cpu")
    with backend, pytest.raises(BadInput, match=r"token ids outside the vocabulary \[0, 256\): \[9999\]"):
        translator.translate_ids([[5, 9999, 3]])


def test_token_id_interface_matches_text(demo_artifact):
    from num2words import num2words

    from twostep.runtime.tokenizer import Tokenizer

    tokenizer = Tokenizer.sentencepiece(demo_artifact / "tokenizer.model")
    ids = " ".join(map(str, tokenizer.encode_source("four hundred and two")))
    result = twostep("translate", demo_artifact, "--ids", ids)
    assert result.returncode == 0, result.stderr
    assert tokenizer.decode(int(t) for t in result.stdout.split()) == num2words(402, lang="de")
