"""The manifest's tokenizer section (twostep/artifact/tokenizer.py): what it reads back, what it refuses, and the
missing-language error each front words with its own names."""

from __future__ import annotations

import pytest

from twostep.artifact.tokenizer import Languages, MissingLanguage, TargetLanguage, TokenizerSpec
from twostep.errors import BadArtifact

SPEC = TokenizerSpec(source_model="tokenizer.json", target_model="tokenizer.json", kind="tokenizers",
                     source_suffix=(2,), drop_ids=(0, 1, 2, 3), unk_id=3, trailing_space=(4,),
                     languages=Languages(source={"eng_Latn": (90,)},
                                         target={"fra_Latn": TargetLanguage(decoder=(91,))}))


def test_a_section_reads_back_as_written():
    assert TokenizerSpec.parse(SPEC.to_json(), "m", (100, 100)) == SPEC


def test_an_older_section_reads_with_the_defaults():
    data = {k: v for k, v in SPEC.to_json().items() if k not in ("kind", "trailing_space")}
    spec = TokenizerSpec.parse(data, "m", (100, 100))
    assert (spec.kind, spec.trailing_space) == ("sentencepiece", ())


@pytest.mark.parametrize("key, value, message", [
    ("kind", "wordpiece", "kind 'wordpiece' is not one of sentencepiece, tokenizers"),
    ("trailing_space", [100], "trailing_space must be a list of ids below 100"),
    ("trailing_space", "▁", "trailing_space must be a list of ids below 100"),
])
def test_a_malformed_section_is_refused_naming_the_key(key, value, message):
    with pytest.raises(BadArtifact, match=message):
        TokenizerSpec.parse({**SPEC.to_json(), key: value}, "m", (100, 100))


def test_a_missing_language_is_worded_with_the_options_name_of_each_front():
    with pytest.raises(MissingLanguage) as caught:
        SPEC.decoder_prefix(None)
    assert str(caught.value) == "this model needs a target language: --tgt-lang one of fra_Latn"
    assert caught.value.worded(MissingLanguage.FIELDS[caught.value.side]) == \
        "this model needs a target language: tgt_lang one of fra_Latn"
