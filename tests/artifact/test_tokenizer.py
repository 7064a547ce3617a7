"""The manifest's tokenizer section (twostep/artifact/tokenizer.py): what it reads back, what it refuses, and the
missing-language error each front words with its own names."""

from __future__ import annotations

import dataclasses
import json

import pytest

from twostep.artifact import load_artifact
from twostep.artifact.tokenizer import (
    Languages,
    MissingLanguage,
    TargetLanguage,
    TokenizerSpec,
    normalized,
    region_dropped,
)
from twostep.errors import BadArtifact, BadInput

SPEC = TokenizerSpec(source_model="tokenizer.json", target_model="tokenizer.json", kind="tokenizers",
                     source_suffix=(2,), drop_ids=(0, 1, 2, 3), unk_id=3, trailing_space=(4,),
                     languages=Languages(source={"eng_Latn": (90,)},
                                         target={"fra_Latn": TargetLanguage(decoder=(91,))}))


def test_a_section_reads_back_as_written():
    assert TokenizerSpec.parse(SPEC.to_json(), "m", (100, 100)) == SPEC


def test_a_moses_bpe_section_reads_back_with_its_languages_and_needs_them():
    spec = dataclasses.replace(SPEC, kind="moses-bpe", source_model="bpe.codes", target_model="bpe.codes",
                               moses=("en", "fr"))
    assert TokenizerSpec.parse(spec.to_json(), "m", (100, 100)) == spec
    for moses in (None, ["en"], ["en", ""], "en"):
        data = {**spec.to_json(), "moses": moses}
        with pytest.raises(BadArtifact, match="moses must be"):
            TokenizerSpec.parse(data, "m", (100, 100))


def test_an_older_section_reads_with_the_defaults():
    data = {k: v for k, v in SPEC.to_json().items() if k not in ("kind", "trailing_space")}
    spec = TokenizerSpec.parse(data, "m", (100, 100))
    assert (spec.kind, spec.trailing_space) == ("sentencepiece", ())


@pytest.mark.parametrize("key, value, message", [
    ("kind", "wordpiece", "kind 'wordpiece' is not one of sentencepiece, tokenizers, moses-bpe"),
    ("moses", ["en", "fr"], r"moses must be \[source language, target language\] for kind moses-bpe \(and only"),
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


# model codes with regions (mBART-50's en_XX beside a regional one, Portuguese, Latin American Spanish, Chinese)
REGIONAL = {"en_GB": "en_GB", "en-GB": "en_GB", "en-AU": "en_GB", "en": "en_XX", "en-US": "en_XX",
            "pt-BR": "pt_BR", "pt-PT": "pt_PT", "es-419": "es_419", "es-MX": "es_419", "es": "es_XX",
            "zh-TW": "zh_TW", "zh-Hant-TW": "zh_TW", "zh-HK": "zh_HK", "zh-Hans": "zh_CN", "zh": "zh_CN"}


@pytest.mark.parametrize("code", sorted(REGIONAL))
def test_the_nearest_code_wins_and_a_region_that_tells_codes_apart_is_kept(code):
    codes = sorted(set(REGIONAL.values()))
    languages = Languages(target={c: TargetLanguage(decoder=(i,)) for i, c in enumerate(codes)})
    assert languages.pick("target", code) == REGIONAL[code]
    assert alias_pick(languages.to_json(), "target", code) == REGIONAL[code]  # the C++ library's way too


@pytest.mark.parametrize("key, dropped", [("fr-ca", "fr"), ("es-419", "es"), ("zh-hant-tw", "zh-hant"),
                                          ("fa-af-tw", None), ("fr", None), ("zh-hant", None)])
def test_a_tag_loses_its_one_region_and_a_tag_with_two_is_not_cut_to_one(key, dropped):
    assert region_dropped(key) == dropped


# What a request may type: each family's French, regions, scripts, macrolanguages, case and '_', unknown codes
STANDARD_CODES = ["fr", "fra", "fre", "fr-FR", "fr-CA", "fr_BE", "FR", "fra-FR", "fr-Latn", "fr-Latn-FR", "fr-419",
                  "en", "en-US", "en-GB", "eng", "de", "deu", "ger", "de-AT", "de-DE", "zh", "zho", "chi", "cmn",
                  "zh-CN", "zh-TW", "zh-HK", "zh-SG", "zh-Hant", "zh-Hans", "zh-Hant-TW", "zh-Hans-TW", "zho-TW",
                  "pt", "pt-BR", "pt-PT", "por", "ar", "ara", "arb", "ary", "ar-MA", "sr", "sr-Latn", "sr-ME",
                  "xx", "qq-ZZ", "12", "french", "en-XX", "FRA_LATN", "zho_hant"]


def alias_pick(languages: dict, side: str, code: str) -> str:
    """What the C++ library (cpp/src/manifest.cpp's pick_language) makes of a code with the manifest's aliases: the
    model's own as it is, else the normalized code's entry, else its entry without the region; the same messages
    as Languages.pick."""
    known = sorted(languages[side])
    if code in known:
        return code
    aliases = languages.get("aliases", {})
    key = normalized(code)
    if key not in aliases and region_dropped(key):
        key = region_dropped(key)
    matches = sorted(c for c in aliases.get(key, []) if c in known)
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise BadInput(f"ambiguous {side} language {code!r}: it may be {' or '.join(matches)}; name one of them")
    have = f"this model has {', '.join(known)}" if known else f"this model has no {side} languages"
    raise BadInput(f"unknown {side} language {code!r}: {have}")


def outcome(pick, *args) -> str:
    try:
        return pick(*args)
    except BadInput as exc:
        return str(exc)


def assert_aliases_pick_as_python(data: dict, languages: Languages, codes: list[str]) -> None:
    for side in ("source", "target"):
        want = {code: outcome(languages.pick, side, code) for code in codes}
        got = {code: outcome(alias_pick, data, side, code) for code in codes}
        assert got == want, {code: (got[code], want[code]) for code in codes if got[code] != want[code]}


@pytest.mark.parametrize("family", sorted(FAMILY_CODES))
def test_the_written_aliases_pick_as_python_does(family):
    codes = FAMILY_CODES[family]
    languages = Languages(source={c: (i,) for i, c in enumerate(codes)},
                          target={c: TargetLanguage(decoder=(i,)) for i, c in enumerate(codes)})
    data = languages.to_json()
    assert_aliases_pick_as_python(data, languages, STANDARD_CODES + codes + [c.lower() for c in codes])
    assert data["aliases"]["fr"] == [FRENCH[family]]
    assert data["aliases"]["fre"] == [FRENCH[family]]


def test_ambiguous_codes_are_written_with_every_candidate():
    languages = Languages(target={"pt_XX": TargetLanguage(decoder=(1,)), "pt_BR": TargetLanguage(decoder=(2,))})
    data = languages.to_json()
    assert data["aliases"]["pt"] == ["pt_BR", "pt_XX"]
    with pytest.raises(BadInput, match="ambiguous target language 'pt': it may be pt_BR or pt_XX; name one of them"):
        alias_pick(data, "target", "pt")
    assert_aliases_pick_as_python(data, languages, STANDARD_CODES + ["pt_BR", "pt_XX", "pt-xx"])


def test_a_section_without_aliases_reads_and_one_with_malformed_aliases_is_refused():
    data = SPEC.to_json()
    assert data["languages"]["aliases"]["fr"] == ["fra_Latn"]
    del data["languages"]["aliases"]  # an older artifact
    assert TokenizerSpec.parse(data, "m", (100, 100)) == SPEC
    for aliases in ({"it": ["ita_Latn"]}, {"fr": "fra_Latn"}, [], {"fr": [["fra_Latn"]]}):
        data["languages"]["aliases"] = aliases
        with pytest.raises(BadArtifact, match="languages.aliases must map codes to lists of the model's codes"):
            TokenizerSpec.parse(data, "m", (100, 100))


def test_an_exported_manifests_aliases_pick_as_python_does(pretrained):
    """Each family imported and exported (tests/conftest.py): the manifest's aliases, read as the C++ library reads
    them, give what Languages.pick gives, model codes included."""
    data = json.loads((pretrained.art / "manifest.json").read_text())["tokenizer"]["languages"]
    languages = load_artifact(pretrained.art).manifest.tokenizer.languages
    codes = sorted({*languages.source, *languages.target})
    if not codes:  # a model without languages (Marian with one target language) has no aliases either
        assert "aliases" not in data
        return
    assert_aliases_pick_as_python(data, languages, STANDARD_CODES + codes + [c.lower() for c in codes])
