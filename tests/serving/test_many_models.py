"""A real `twostep serve` of three Argos pairs (en -> fr, de -> en, en -> es), at most two loaded at once: each
request reaches the model of its pair, or two through English, detection picks the source, and LibreTranslate's
clients (libretranslatepy, Mastodon's and Weblate's request shapes) get its answers."""

from __future__ import annotations

import json
import shutil
import urllib.error

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")
libretranslatepy = pytest.importorskip("libretranslatepy", reason="LibreTranslate's client (pip install -e '.[dev]')")
pytest.importorskip("lingua", reason="detection needs its extra (pip install -e '.[serve]')")

from serving_helpers import post, refused_start, server  # noqa: E402
from twostep.runtime.translator import open_translator  # noqa: E402
from twostep.serving.api.libretranslate import formatted  # noqa: E402

pytestmark = pytest.mark.slow

ENGLISH = ["The weather is nice today.", "I would like a cup of coffee, please."]
GERMAN = ["Das Wetter ist heute sehr schön.", "Ich möchte bitte eine Tasse Kaffee trinken."]
FRENCH = "Je voudrais réserver une table pour deux personnes ce soir, s'il vous plaît."  # a target only


@pytest.fixture(scope="module")
def pairs(argos_pairs):
    return argos_pairs


@pytest.fixture(scope="module")
def reference(pairs):
    """Each pair's translations by the Python runtime, one model at a time: what the server must give."""
    out = {}
    for pair, art in pairs.items():
        translator, backend = open_translator(art)
        with backend:
            out[pair] = {text: translator.translate([text])[0] for text in [*ENGLISH, *GERMAN]}
    german_english = out["de", "en"]
    translator, backend = open_translator(pairs["en", "fr"])
    with backend:  # through the pivot: the first model's best translation is the second's source
        out["de", "fr"] = {g: translator.translate([german_english[g]])[0] for g in GERMAN}
    return out


@pytest.fixture(scope="module")
def many(pairs, tmp_path_factory):
    root = tmp_path_factory.mktemp("many")
    for (source, target), art in pairs.items():  # a folder of artifacts, and one named beside it
        if (source, target) != ("en", "es"):
            shutil.copytree(art, root / "all" / f"{source}_{target}")
    with server(root / "all", pairs["en", "es"], "--max-loaded", 2, "--max-sentences", 16) as (url, proc):
        yield url, proc


def test_libretranslate_client_reaches_each_pair_and_the_pivot(many, reference):
    url, proc = many
    client = libretranslatepy.LibreTranslateAPI(url)
    # what LibreTranslate 1.9.6 lists for these three packages (argostranslate's languages: each with itself)
    assert client.languages() == [{"code": "en", "name": "English", "targets": ["en", "es", "fr"]},
                                  {"code": "fr", "name": "French", "targets": ["fr"]},
                                  {"code": "de", "name": "German", "targets": ["de", "en", "es", "fr"]},
                                  {"code": "es", "name": "Spanish", "targets": ["es"]}]
    for _ in range(2):  # three models, two loaded: each round loads one anew
        for source, target in (("en", "fr"), ("de", "en"), ("en", "es"), ("de", "fr")):
            texts = ENGLISH if source == "en" else GERMAN
            assert [client.translate(t, source, target) for t in texts] == [
                formatted(t, reference[source, target][t]) for t in texts]  # LibreTranslate's formatting
    assert client.translate(ENGLISH[0], "en", "en") == ENGLISH[0]  # one language: the text as it came
    log = "".join(proc.log)
    assert log.count("unloading") >= 3 and "(2 loaded)" in log and "(3 loaded)" not in log
    languages = httpx.get(f"{url}/v1/languages", timeout=30).json()
    german = next(s for s in languages["source"] if s["code"] == "de")
    assert german["name"] == "German" and german["targets"] == ["en", "es", "fr"] and german["pivoted"] == ["es", "fr"]
    assert sorted(m["name"] for m in languages["models"]) == ["de_en", "en_es", "en_fr"]
    settings = httpx.get(f"{url}/frontend/settings", timeout=30).json()  # what LibreTranslate's web UI reads
    assert settings["charLimit"] == 20_000 and settings["keyRequired"] is False and settings["apiKeys"] is False
    assert settings["language"] == {"source": {"code": "auto", "name": "Auto Detect"},
                                    "target": {"code": "es", "name": "Spanish"}}
    assert [settings[key] for key in ("filesTranslation", "suggestions", "supportedFilesFormat")] == [
        True, False, [".txt", ".odt", ".odp", ".docx", ".pptx", ".epub", ".html", ".srt"]]
    assert {"/translate", "/detect", "/languages"} <= set(httpx.get(f"{url}/spec", timeout=30).json()["paths"])
    r = post(url, {"text": GERMAN, "src_lang": "de", "tgt_lang": "fr", "beam": 2, "n_best": 2})
    assert r.status_code == 200, r.text
    assert [hyps[0]["text"] for hyps in r.json()["translations"]] == [reference["de", "fr"][g] for g in GERMAN]


def test_the_api_document_names_the_languages_a_request_may_name(many):
    """A client generated from the document (an SDK, schemathesis) names only languages the server has: once the
    models are open, the document enumerates them, as GET /languages and /v1/languages list them."""
    url, _ = many
    document = httpx.get(f"{url}/openapi.json", timeout=30).json()
    listed = httpx.get(f"{url}/languages", timeout=30).json()
    sources, targets = {"auto", *(lang["code"] for lang in listed)}, {t for lang in listed for t in lang["targets"]}
    for content in document["paths"]["/translate"]["post"]["requestBody"]["content"].values():
        codes = content["schema"]["properties"]
        assert (set(codes["source"]["enum"]), set(codes["target"]["enum"])) == (sources, targets)
    fields = document["components"]["schemas"]["TranslateRequest"]["properties"]
    named = {name: next(b for b in fields[name]["anyOf"] if b.get("type") == "string")["enum"]
             for name in ("src_lang", "tgt_lang")}
    languages = httpx.get(f"{url}/v1/languages", timeout=30).json()
    assert set(named["src_lang"]) == {"auto", *(s["code"] for s in languages["source"])}
    assert set(named["tgt_lang"]) == {t["code"] for t in languages["target"]}


def test_auto_detects_each_texts_language(many, reference):
    url, _ = many
    client = libretranslatepy.LibreTranslateAPI(url)
    detected = client.detect(GERMAN[0])
    assert detected[0]["language"] == "de" and 50 < detected[0]["confidence"] <= 100
    assert [d["language"] for d in detected] == sorted((d["language"] for d in detected),
                                                       key=lambda lang: -next(d["confidence"] for d in detected
                                                                              if d["language"] == lang))
    # a language the server only translates into is detected too (LibreTranslate detects among all it lists),
    # and translated as LibreTranslate translates it: to itself as it came, to another not at all
    assert client.detect(FRENCH)[0]["language"] == "fr"
    assert httpx.post(f"{url}/detect", json={"q": [FRENCH, FRENCH]}, timeout=60).json()[0]["language"] == "fr"
    itself = httpx.post(f"{url}/translate", json={"q": FRENCH, "source": "auto", "target": "fr"}, timeout=60).json()
    assert itself["translatedText"] == FRENCH and itself["detectedLanguage"]["language"] == "fr"
    r = httpx.post(f"{url}/translate", json={"q": FRENCH, "source": "auto", "target": "en"}, timeout=60)
    assert (r.status_code, r.json()) == (400, {"error": "English (en) is not available as a target language from "
                                                        "French (fr)"})
    # Mastodon: a list of html paragraphs, source auto, format html; it reads translatedText[i] and
    # detectedLanguage[i].language
    mastodon = {"q": [f"<p>{ENGLISH[0]}</p>", f"<p>{GERMAN[0]}</p>", "<p>🎉</p>"], "source": "auto", "target": "fr",
                "format": "html"}
    r = httpx.post(f"{url}/translate", json=mastodon, timeout=60)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["translatedText"] == [f"<p>{reference['en', 'fr'][ENGLISH[0]]}</p>",
                                        f"<p>{reference['de', 'fr'][GERMAN[0]]}</p>", "<p>🎉</p>"]
    assert [d["language"] for d in answer["detectedLanguage"]] == ["en", "de", "en"]
    assert answer["detectedLanguage"][2]["confidence"] == 0  # nothing to translate: LibreTranslate's fallback
    one = httpx.post(f"{url}/translate", json={"q": GERMAN[1], "source": "auto", "target": "en"}, timeout=60).json()
    assert one == {"translatedText": formatted(GERMAN[1], reference["de", "en"][GERMAN[1]]),
                   "detectedLanguage": {"language": "de", "confidence": one["detectedLanguage"]["confidence"]}}
    v1 = post(url, {"text": [ENGLISH[1], GERMAN[1]], "src_lang": "auto", "tgt_lang": "es"})
    assert v1.status_code == 200, v1.text
    assert [d["language"] for d in v1.json()["detected"]] == ["en", "de"]
    # Weblate: a form post; its /languages read above
    weblate = httpx.post(f"{url}/translate", data={"q": ENGLISH[0], "source": "en", "target": "es",
                                                   "format": "text"}, timeout=60)
    assert weblate.json() == {"translatedText": formatted(ENGLISH[0], reference["en", "es"][ENGLISH[0]])}


@pytest.mark.parametrize("path, body, message", [
    ("/translate", {"q": "Ciao", "source": "it", "target": "en"}, "it is not supported"),
    ("/translate", {"q": "Hello", "source": "en", "target": "de"},
     "German (de) is not available as a target language from English (en)"),
    ("/translate", {"q": "Привет, как дела? Сегодня хорошая погода.", "source": "auto", "target": "fr"},
     "the language of text 1 is none of this server's languages (de, en, es, fr): name the source"),
    ("/detect", {}, "Invalid request: missing q parameter"),
    ("/detect", {"q": []}, "Invalid request: missing q parameter"),
])
def test_bad_requests_are_one_line_and_the_server_keeps_serving(many, reference, path, body, message):
    url, _ = many
    r = httpx.post(f"{url}{path}", json=body, timeout=60)
    assert (r.status_code, r.json()) == (400, {"error": message})
    client = libretranslatepy.LibreTranslateAPI(url)
    assert client.translate(ENGLISH[0], "en", "fr") == formatted(ENGLISH[0], reference["en", "fr"][ENGLISH[0]])


def test_a_pair_no_model_and_no_pivot_reaches_is_libretranslates_400(pairs):
    with server(pairs["de", "en"], pairs["en", "fr"], "--pivot", "none") as (url, _):
        client = libretranslatepy.LibreTranslateAPI(url)
        with pytest.raises(urllib.error.HTTPError) as refused:
            client.translate(GERMAN[0], "de", "fr")
        assert refused.value.code == 400
        assert json.loads(refused.value.read()) == {
            "error": "French (fr) is not available as a target language from German (de)"}
        assert {lang["code"]: lang["targets"] for lang in client.languages()} == {
            "en": ["en", "fr"], "fr": ["fr"], "de": ["de", "en"]}


def test_two_artifacts_of_one_pair_are_refused_at_start(pairs, tmp_path):
    shutil.copytree(pairs["en", "fr"], tmp_path / "again")
    result = refused_start(pairs["en", "fr"], tmp_path / "again")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "both translate en -> fr" in lines[0] and "serve one of them" in lines[0]


def test_a_pivoted_pair_finds_glossary_terms_in_the_source_and_forces_them_into_the_target(many):
    """de -> fr goes through English: the terms are found in the German text (an English term of the pivot's
    sentence is not), forced on the leg into French; a stored glossary of another pair is refused."""
    url, _ = many
    term = {"source": "Wetter", "targets": ["zebra"]}  # pieces the tiny French vocabulary has
    pivot_term = {"source": "weather", "targets": ["zebra"]}
    r = post(url, {"text": GERMAN[:1], "src_lang": "de", "tgt_lang": "fr", "glossary": [term, pivot_term]})
    assert r.status_code == 200, r.text
    got = r.json()
    assert "zebra" in got["translations"][0][0]["text"], got
    assert got["applied_terms"] == [[term]] and got["unmet_terms"] == [[]]
    made = httpx.post(f"{url}/v1/glossaries", timeout=30, json={"name": "g", "source_lang": "de", "target_lang": "fra",
                                                                 "entries": "Wetter\tzebra\n"})
    assert made.status_code == 201 and made.json()["target_lang"] == "fr", made.text  # a standard tag
    gid = made.json()["glossary_id"]
    assert "zebra" in post(url, {"text": GERMAN[:1], "src_lang": "de", "tgt_lang": "fr-FR",
                                 "glossary_id": gid}).json()["translations"][0][0]["text"]
    other = post(url, {"text": GERMAN[:1], "src_lang": "de", "tgt_lang": "en", "glossary_id": gid})
    assert (other.status_code, other.json()) == (400, {"error": f"glossary {gid} is for de->fr; this request "
                                                                "translates de->en"})
    unknown = httpx.post(f"{url}/v1/glossaries", timeout=30, json={"name": "g", "source_lang": "de", "target_lang":
                                                                    "zz", "entries": "Wetter\tzebra\n"})
    assert unknown.status_code == 400 and "unknown target language 'zz'" in unknown.json()["error"], unknown.text
