"""LibreTranslate's rules in twostep/serving/api/libretranslate.py, called directly, with literal answers: the server
tests compare a served text with formatted() itself, so they cannot see a formatting rule go wrong. Each expected
text is what LibreTranslate 1.9.6's improve_translation_formatting (libretranslate/language.py) returns for the
same pair."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")

from twostep.artifact.tokenizer import Languages, TargetLanguage  # noqa: E402
from twostep.serving.api.libretranslate import formatted, language, ranked_languages, routed  # noqa: E402
from twostep.serving.models import Catalog, Model, Unsupported  # noqa: E402


@pytest.mark.parametrize("source, translation, answer", [
    # the repeat rule: a one-word source (under 20 characters) whose translation has a word at least twice as
    # often as it has distinct words is cut to the translation's first word, whichever word repeats
    ("Hello", "amigo hola hola hola hola", "Amigo"),
    ("Hello", "hola hola amigo", "Hola hola amigo"),  # 2 of "hola" over 2 distinct words: kept
    ("Hello", "a b a b a b", "A b a b a b"),  # 3 each over 2 distinct: kept
    ("Supercalifragilistic", "hola hola hola", "Hola hola hola"),  # 20 characters: kept
    ("Hello you", "hola hola hola", "Hola hola hola"),  # two words: kept
    # 。 is a final mark as the others are
    ("你好。", "Hello", "Hello。"),
    ("Hello。", "你好", "你好。"),
    ("Hello!", "Hola。", "Hola!"),
    ("Hello", "Hola。", "Hola"),
    ("Hi;", "Salut,", "Salut;"),
])
def test_formatted_is_libretranslates_text(source, translation, answer):
    assert formatted(source, translation) == answer


def test_codes_are_read_lower_case():
    assert language(" FR ", "target") == "fr"
    assert language("ZT", "target") == "zt"


def test_libretranslates_own_codes_name_chinese_and_brazilian_portuguese():
    """zt is zh-Hant and pb pt-BR (LibreTranslate's aliases), found by the standard tags of a model's own codes."""
    codes = ["eng_Latn", "zho_Hans", "zho_Hant", "pt_BR"]
    nllb = Model("nllb", Path("/models/nllb"), Languages(source={c: (i,) for i, c in enumerate(codes)},
                                                         target={c: TargetLanguage(decoder=(i,))
                                                                 for i, c in enumerate(codes)}))
    catalog = Catalog.of([nllb, Model("en_fr", Path("/models/en_fr"), Languages(
        source={"en": ()}, target={"fr": TargetLanguage()}))])
    assert routed(catalog, "en", "zt").legs[0].target == "zho_Hant"
    assert routed(catalog, "en", "pb").legs[0].target == "pt_BR"
    with pytest.raises(Unsupported, match="^xx is not supported$"):
        routed(catalog, "en", "xx")


def test_a_lists_confidences_are_averaged_over_its_texts():
    """Each language's confidence summed over the texts and divided by their number (0 where a text did not name
    it), best first, rounded to one decimal; nothing detected: the fallback at 0."""
    found = [[("fr", 90.0), ("en", 10.0)], [("en", 60.0)], [("fr", 50.0), ("en", 50.0)]]
    assert ranked_languages(found, ["en", "fr"]) == [{"confidence": 46.7, "language": "fr"},
                                                     {"confidence": 40.0, "language": "en"}]
    assert ranked_languages([[("fr", 80.0)]], ["en", "fr"]) == [{"confidence": 80.0, "language": "fr"}]
    assert ranked_languages([[], []], ["fr", "en"]) == [{"confidence": 0.0, "language": "en"}]
