"""The manifest's tokenizer section (twostep/artifact/tokenizer.py): what it reads back, what it refuses, and the
missing-language error each front words with its own names."""

from __future__ import annotations

import pytest

from twostep.artifact.tokenizer import Languages, MissingLanguage, TargetLanguage, TokenizerSpec
from twostep.errors import BadArtifact, BadInput

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


# each family's way of naming languages: M2M100, Marian (multilingual), NLLB, mBART-50
FAMILY_CODES = {"m2m100": ["en", "fr", "de", "zh", "pt"], "marian": ["eng", "fra", "deu", "zho_Hant", "por"],
                "nllb": ["eng_Latn", "fra_Latn", "deu_Latn", "zho_Hans", "zho_Hant", "arb_Arab", "ary_Arab",
                         "srp_Cyrl", "por_Latn"],
                "mbart50": ["en_XX", "fr_XX", "de_DE", "zh_CN", "pt_XX"]}
FRENCH = {"m2m100": "fr", "marian": "fra", "nllb": "fra_Latn", "mbart50": "fr_XX"}


@pytest.mark.parametrize("family", sorted(FAMILY_CODES))
@pytest.mark.parametrize("code", ["fr", "fra", "fre", "fr-FR", "FR", "fr-CA"])
def test_a_standard_code_picks_the_models_own(family, code):
    languages = Languages(target={c: TargetLanguage(decoder=(i,)) for i, c in enumerate(FAMILY_CODES[family])})
    assert languages.pick("target", code) == FRENCH[family]
    assert languages.pick("target", FRENCH[family]) == FRENCH[family]  # the model's own, as it is


@pytest.mark.parametrize("code, want", [("zh", "zho_Hans"), ("zh-Hant", "zho_Hant"), ("zh-TW", "zho_Hant"),
                                        ("ar", "arb_Arab"), ("ary", "ary_Arab"), ("pt-BR", "por_Latn"),
                                        ("en-US", "eng_Latn"), ("sr", "srp_Cyrl")])
def test_regions_scripts_and_macrolanguages_resolve_as_langcodes_relates_them(code, want):
    languages = Languages(source={c: (i,) for i, c in enumerate(FAMILY_CODES["nllb"])})
    assert languages.pick("source", code) == want


@pytest.mark.parametrize("code", ["sr-Latn", "xx", "qq-ZZ", "12", "french"])
def test_a_code_of_another_language_or_script_or_none_is_unknown_with_the_models_list(code):
    languages = Languages(source={c: (i,) for i, c in enumerate(FAMILY_CODES["nllb"])})
    with pytest.raises(BadInput, match=rf"unknown source language '{code}': this model has arb_Arab, ary_Arab, "):
        languages.pick("source", code)


def test_a_code_two_of_the_models_codes_match_equally_is_ambiguous():
    languages = Languages(target={"pt_XX": TargetLanguage(decoder=(1,)), "pt_BR": TargetLanguage(decoder=(2,))})
    with pytest.raises(BadInput, match="ambiguous target language 'pt': it may be pt_BR or pt_XX; name one of them"):
        languages.pick("target", "pt")
    assert languages.pick("target", "pt_BR") == "pt_BR"
