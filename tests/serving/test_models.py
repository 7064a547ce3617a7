"""Which model answers a pair (twostep/serving/models.py: Catalog) and which are loaded (Pool), without a server:
models are their languages here (Catalog.of), as a manifest gives them."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from twostep.artifact.tokenizer import Languages, TargetLanguage
from twostep.errors import BadInput, TwostepError
from twostep.serving.models import Catalog, Model, Pool, Unsupported, model_paths


def bilingual(source: str, target: str, name: str | None = None) -> Model:
    """An Argos package's languages."""
    name = name or f"{source}_{target}"
    return Model(name, Path("/models") / name, Languages(source={source: ()}, target={target: TargetLanguage()},
                                                         default_source=source, default_target=target))


def multilingual(codes: list[str], name: str = "nllb") -> Model:
    """NLLB's shape: every code on both sides, a token each."""
    return Model(name, Path("/models") / name, Languages(
        source={c: (i,) for i, c in enumerate(codes)}, target={c: TargetLanguage(decoder=(i,)) for i, c in
                                                               enumerate(codes)}))


NLLB = multilingual(["eng_Latn", "fra_Latn", "deu_Latn", "zho_Hans", "zho_Hant"])


def legs(route) -> list[tuple[str, str | None, str | None]]:
    return [(leg.model.name, leg.source, leg.target) for leg in route.legs]


def test_the_most_specialized_model_answers_whatever_the_order_given():
    for models in ([NLLB, bilingual("en", "fr")], [bilingual("en", "fr"), NLLB]):
        catalog = Catalog.of(models)
        assert legs(catalog.route("en", "fr")) == [("en_fr", "en", "fr")]
        assert legs(catalog.route("en-US", "fr-FR")) == [("en_fr", "en", "fr")]  # standard tags, resolved
        assert legs(catalog.route("en", "de")) == [("nllb", "eng_Latn", "deu_Latn")]  # only NLLB has it
        assert legs(catalog.route("eng_Latn", "fra_Latn")) == [("en_fr", "en", "fr")]  # a model's own code too


def test_a_pair_no_model_has_goes_through_the_pivot_and_one_language_through_none():
    catalog = Catalog.of([bilingual("de", "en"), bilingual("en", "fr"), bilingual("en", "es")])
    route = catalog.route("de", "fr")
    assert route.pivoted and legs(route) == [("de_en", "de", "en"), ("en_fr", "en", "fr")]
    assert (route.source, route.target) == ("de", "fr")
    assert legs(catalog.route("de", "en")) == [("de_en", "de", "en")]
    assert catalog.route("en", "en").legs == ()  # argostranslate's identity translation
    assert catalog.reachable() == {"de": (["en"], ["es", "fr"]), "en": (["es", "fr"], [])}
    without = Catalog.of([bilingual("de", "en"), bilingual("en", "fr")], pivot=None)
    with pytest.raises(Unsupported, match=r"^French \(fr\) is not available as a target language from German "
                                          r"\(de\)$"):
        without.route("de", "fr")
    assert without.reachable() == {"de": (["en"], []), "en": (["fr"], [])}
    other = Catalog.of([bilingual("de", "fr"), bilingual("fr", "es")], pivot="fr")
    assert legs(other.route("de", "es")) == [("de_fr", "de", "fr"), ("fr_es", "fr", "es")]


def test_an_unknown_language_is_refused_in_libretranslates_words_and_twosteps():
    catalog = Catalog.of([bilingual("de", "en"), bilingual("en", "fr")])
    with pytest.raises(Unsupported, match="^zz is not supported$") as refused:
        catalog.route("en", "zz")
    assert refused.value.plain == "unknown target language 'zz': the server's models have en, fr"
    with pytest.raises(BadInput, match="name both the source and the target"):
        catalog.route(None, "fr")
    with pytest.raises(BadInput, match="ambiguous target language 'en': it may be en_GB or en_IN"):
        Catalog.of([multilingual(["en_GB", "en_IN", "fr_XX"]), bilingual("de", "en")]).route("fr", "en")


def test_every_language_of_a_model_reaches_itself_and_what_its_models_and_the_pivot_reach():
    """argostranslate's installed languages, which LibreTranslate lists and routes: each language a model translates
    from or into, with an identity translation to itself and composite ones through the pivot. A language only
    translated into is a source to itself alone; from it to another, LibreTranslate's "not available"."""
    catalog = Catalog.of([bilingual("en", "fr"), bilingual("de", "en")])
    assert catalog.languages() == {"de": ["de", "en", "fr"], "en": ["en", "fr"], "fr": ["fr"]}
    assert catalog.route("fr", "fr").legs == () and catalog.route("de", "de").legs == ()  # the text as it came
    with pytest.raises(Unsupported, match=r"^English \(en\) is not available as a target language from French "
                                          r"\(fr\)$"):
        catalog.route("fr", "en")
    with pytest.raises(Unsupported, match=r"^German \(de\) is not available as a target language from English "
                                          r"\(en\)$"):
        catalog.route("en", "de")
    without = Catalog.of([bilingual("en", "fr"), bilingual("de", "en")], pivot=None)
    assert without.languages() == {"de": ["de", "en"], "en": ["en", "fr"], "fr": ["fr"]}
    nllb = Catalog.of([NLLB])
    assert nllb.languages()["fr"] == ["de", "en", "fr", "zh-Hans", "zh-Hant"]


def test_one_model_keeps_its_own_rules():
    marian = Model("marian", Path("/m"), Languages(target={"fra": TargetLanguage(source=(7,))}))
    catalog = Catalog.of([marian])
    assert legs(catalog.route("anything", "fr")) == [("marian", "anything", "fra")]  # the translator's to refuse
    assert legs(catalog.route("anything", "fr", lenient=True)) == [("marian", None, "fra")]  # LibreTranslate's
    with pytest.raises(Unsupported, match="^de is not supported$") as refused:
        catalog.route("en", "de")
    assert refused.value.plain == "unknown target language 'de': this model has fra"
    bare = Catalog.of([Model("demo", Path("/demo"), None)])
    assert legs(bare.route("en", "de", lenient=True)) == [("demo", None, None)]
    assert bare.reachable() == {} and bare.source_tags() == [] and bare.languages() == {}
    assert catalog.languages() == {}  # a side it names nothing for takes any code: no language to list
    nllb = Catalog.of([NLLB])
    assert legs(nllb.route(None, "fr")) == [("nllb", None, "fra_Latn")]  # the translator's default, or its refusal


def test_models_that_cannot_share_a_server_are_refused_naming_them():
    with pytest.raises(TwostepError, match=r"/models/a and /models/b both translate en -> fr.*no rule chooses"):
        Catalog.of([bilingual("en", "fr", "a"), bilingual("en", "fr", "b")])
    # a bilingual model beside a multilingual one that shares its pair: the rule chooses (fewest pairs)
    assert Catalog.of([bilingual("en", "fr"), NLLB]).models[0].name == "en_fr"
    marian = Model("marian", Path("/m"), Languages(target={"fra": TargetLanguage(source=(7,))}))
    with pytest.raises(TwostepError, match=r"/m: names no source language.*--src-lang"):
        Catalog.of([marian, bilingual("en", "fr")])


def test_a_source_the_pivot_leads_back_to_is_not_its_own_pivoted_target():
    """de -> en and en -> de: en reaches de, but de through en to de is no translation (de -> de is the identity)."""
    catalog = Catalog.of([bilingual("de", "en"), bilingual("en", "de"), bilingual("en", "fr")])
    assert catalog.reachable() == {"de": (["en"], ["fr"]), "en": (["de", "fr"], [])}
    assert catalog.route("de", "de").legs == ()


def test_equal_models_sharing_a_pair_that_a_smaller_one_answers_may_share_a_server():
    """en+de -> fr and en+es -> fr share en -> fr, with two pairs each; the bilingual en -> fr answers it, whatever
    the order given, so a rule chooses: the server starts, and each keeps its own other pair."""
    def two(extra: str) -> Model:
        return Model(f"{extra}_fr", Path("/models") / extra, Languages(source={"en": (), extra: ()},
                                                                       target={"fr": TargetLanguage()}))

    for models in ([two("de"), two("es"), bilingual("en", "fr")], [bilingual("en", "fr"), two("de"), two("es")]):
        catalog = Catalog.of(models)
        assert legs(catalog.route("en", "fr")) == [("en_fr", "en", "fr")]
        assert legs(catalog.route("de", "fr")) == [("de_fr", "de", "fr")]
        assert legs(catalog.route("es", "fr")) == [("es_fr", "es", "fr")]


def test_a_tag_two_codes_of_a_model_share_is_no_name_for_either():
    model = multilingual(["eng_Latn", "en_XX", "fra_Latn"], "two-englishes")
    assert model.names == {"eng_Latn": "eng_Latn", "en_XX": "en_XX", "fra_Latn": "fr"}
    assert ("eng_Latn", "fr") in model.pairs() and ("en", "fr") not in model.pairs()


def test_a_folder_of_artifacts_is_its_subfolders_in_name_order(tmp_path):
    for name in ("b", "a"):
        (tmp_path / "all" / name).mkdir(parents=True)
        (tmp_path / "all" / name / "manifest.json").write_text("{}")
    (tmp_path / "all" / "notes").mkdir()
    assert model_paths([tmp_path / "all"]) == [tmp_path / "all" / "a", tmp_path / "all" / "b"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(TwostepError, match="not an artifact directory, nor a folder of them"):
        model_paths([tmp_path / "empty"])


class Opened:
    """What the pool's opener gives: a translator and a backend that record their closing."""

    def __init__(self, name: str, closed: list[str]):
        self.name, self.closed, self.queue_depth = name, closed, 0

    def close(self):
        self.closed.append(self.name)


def test_the_pool_loads_on_first_use_and_unloads_the_least_recently_used_once_idle():
    opened, closed = [], []

    def opener(model):
        assert threading.current_thread() is not threading.main_thread()  # the event loop goes on meanwhile
        opened.append(model.name)
        return Opened(model.name, closed), Opened(f"{model.name} backend", [])

    a, b, c = bilingual("en", "fr"), bilingual("de", "en"), bilingual("en", "es")

    async def main():
        pool = Pool(opener, max_loaded=2)
        async with pool.use(a) as first:
            assert first.name == "en_fr"
            async with pool.use(b):
                pass
            async with pool.use(a):  # loaded: not opened again, and now the most recent
                pass
            async with pool.use(c):  # b is the least recently used: it leaves
                await asyncio.sleep(0.1)
                assert list(pool.loaded) == [str(a.path), str(c.path)] and closed == ["de_en"]
        busy = await pool.acquire(c)
        async with pool.use(a):  # now the least recently used, c, is busy
            pass
        async with pool.use(b):  # a, idle, leaves rather than c
            await asyncio.sleep(0.1)
            assert list(pool.loaded) == [str(c.path), str(b.path)] and closed == ["de_en", "en_fr"]
        pool.max_loaded = 1
        async with pool.use(a):  # b leaves at once; c, busy, leaves too but closes once released
            await asyncio.sleep(0.1)
            assert list(pool.loaded) == [str(a.path)] and closed == ["de_en", "en_fr", "de_en"]
        pool.release(busy)
        await pool.close()
        return pool

    pool = asyncio.run(main())
    assert opened == ["en_fr", "de_en", "en_es", "de_en", "en_fr"]
    assert closed == ["de_en", "en_fr", "de_en", "en_es", "en_fr"] and not pool.loaded
