"""LibreTranslate's API on a real `twostep serve`, driven by LibreTranslate's own Python client (libretranslatepy)
and by plain httpx for what that client does not send (lists, html, alternatives, JSON)."""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")
libretranslatepy = pytest.importorskip("libretranslatepy", reason="LibreTranslate's client (pip install -e '.[dev]')")

from serving_helpers import post, server  # noqa: E402
from twostep.artifact.tokenizer import Languages, TargetLanguage  # noqa: E402
from twostep.runtime.decoding import DecodeOptions  # noqa: E402
from twostep.runtime.translator import open_translator  # noqa: E402
from twostep.serving.api.libretranslate import formatted, listed  # noqa: E402
from twostep.serving.models import Catalog, Model  # noqa: E402

pytestmark = pytest.mark.slow

KEY = "lt-k3y-0b6d2e"
SENTENCES = ["three hundred and forty-two", "nineteen thousand, eight hundred and seven", "six"]


@pytest.fixture(scope="module")
def demo_server(demo_artifact):
    with server(demo_artifact, "--max-sentences", 16) as (url, proc):
        yield url, proc


@pytest.fixture(scope="module")
def reference(demo_artifact):
    translator, backend = open_translator(demo_artifact, options=DecodeOptions(beam_size=3, n_best=3))
    with backend:  # as LibreTranslate answers them: formatted like their sources
        greedy = translator.translate(SENTENCES, DecodeOptions())
        nbest = translator.translate_nbest(SENTENCES)
    return {"greedy": [formatted(s, t) for s, t in zip(SENTENCES, greedy)], "html": greedy,
            "nbest": [[(formatted(s, t), score) for t, score in hyps] for s, hyps in zip(SENTENCES, nbest)]}


@pytest.mark.parametrize("source, translation, answer", [
    ("Hello world.", "hola mundo", "Hola mundo."),  # the source's final mark, and its first letter's case
    ("Hello world", "Hola mundo.", "Hola mundo"),  # none where the source has none
    ("Hello world?", "Hola mundo.", "Hola mundo?"),
    ("hello there", "HOLA AMIGO", "hola amigo"),  # all lower
    ("HELLO THERE", "hola amigo", "HOLA AMIGO"),  # all upper
    ("Hello", "hola hola hola", "Hola"),  # one word, its translation one word repeated: that word
    ("Hello", "hola amigo", "Hola amigo"),
    ("3 cats", "3 chats.", "3 chats"),
    ("Tom &amp; Jerry", "Tom &amp; Jerry", "Tom & Jerry"),  # entities unescaped
    ("  ", "x", ""), ("Hi.", "", "Hi."),
])
def test_text_is_formatted_as_libretranslate_formats_it(source, translation, answer):
    assert formatted(source, translation) == answer


def packages(*pairs: str) -> Catalog:
    """A server of Argos packages of these pairs ("en-fr"), as their manifests name their languages."""
    return Catalog.of([Model(pair, Path("/models") / pair, Languages(source={pair.split("-")[0]: ()},
                                                                      target={pair.split("-")[1]: TargetLanguage()}))
                       for pair in pairs])


def test_languages_are_listed_as_libretranslate_lists_argostranslates():
    """What LibreTranslate 1.9.6 answers for packages of these pairs, measured with its argostranslate
    (argos-translate-lt 1.12.1, get_installed_languages): every language a package translates from or into, English
    first, then by name; each with the targets it reaches, itself included (its identity translation) and through
    English, sorted by LibreTranslate's own codes (pb before pl: pt-BR is its pb) and named by standard tags."""
    assert listed(packages("en-fr", "de-en")) == [
        {"code": "en", "name": "English", "targets": ["en", "fr"]},
        {"code": "fr", "name": "French", "targets": ["fr"]},
        {"code": "de", "name": "German", "targets": ["de", "en", "fr"]}]
    assert [(lang["code"], lang["targets"]) for lang in listed(packages("en-zh_Hant", "pt_BR-en", "en-fr", "en-pl"))] \
        == [("en", ["en", "fr", "pl", "zh-Hant"]), ("zh-Hant", ["zh-Hant"]), ("fr", ["fr"]), ("pl", ["pl"]),
            ("pt-BR", ["en", "fr", "pt-BR", "pl", "zh-Hant"])]


def refusal(call) -> tuple[int, str]:
    """The status and LibreTranslate error message of a call the client sees fail."""
    with pytest.raises(urllib.error.HTTPError) as failed:
        call()
    return failed.value.code, json.loads(failed.value.read())["error"]


def lt(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/translate", json=body, timeout=60)


def test_libretranslate_client_translates_as_the_python_runtime(demo_server, reference):
    url, proc = demo_server
    client = libretranslatepy.LibreTranslateAPI(url)
    # the demo model names no languages: it translates its one pair whatever the codes say (and lists none:
    # test_many_models lists the languages of models that name theirs)
    assert [client.translate(s, "en", "de") for s in SENTENCES] == reference["greedy"]
    listed = httpx.get(f"{url}/metrics").text
    assert f'twostep_requests_total{{api="libretranslate",status="200"}} {len(SENTENCES)}.0' in listed


def test_lists_alternatives_and_json(demo_server, reference):
    url, _ = demo_server
    r = lt(url, q=SENTENCES, source="en", target="de")
    assert r.status_code == 200 and r.json() == {"translatedText": reference["greedy"]}, r.text
    r = lt(url, q=SENTENCES[0], source="en", target="de", alternatives=2)
    assert r.status_code == 200, r.text
    best, *others = [text for text, _ in reference["nbest"][0]]
    assert r.json()["translatedText"] == best
    assert r.json()["alternatives"] == [t for t in others if t != best]
    form = httpx.post(f"{url}/translate", data={"q": SENTENCES[1], "source": "en", "target": "de",
                                                "alternatives": "2"}, timeout=60)
    assert form.status_code == 200 and form.json()["translatedText"] == reference["nbest"][1][0][0], form.text


def test_html_keeps_its_tags_and_translates_its_text(demo_server, reference):
    url, _ = demo_server
    a, b, c = SENTENCES
    page = f'<p class="n">{a}</p>\n<ul><li><b>{c}</b><li>{b}</ul><!-- {c} -->'
    r = lt(url, q=page, source="en", target="de", format="html")
    assert r.status_code == 200, r.text
    ta, tb, tc = reference["html"]  # html: not formatted, as LibreTranslate
    assert r.json()["translatedText"] == f'<p class="n">{ta}</p>\n<ul><li><b>{tc}</b><li>{tb}</ul><!-- {c} -->'
    # alternatives asked for html: none (LibreTranslate answers an empty list), the text as without them
    r = lt(url, q=[page, f"<i>{a}</i>"], source="en", target="de", format="html", alternatives=2)
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": [f'<p class="n">{ta}</p>\n<ul><li><b>{tc}</b><li>{tb}</ul><!-- {c} -->',
                                           f"<i>{ta}</i>"], "alternatives": [[], []]}


@pytest.mark.parametrize("body, status, message", [
    ({"q": "<p><b>six</p>", "format": "html"}, 400, "<b> at line 1, column 4 is not closed before </p>"),
    ({"q": "six</i>", "format": "html"}, 400, "</i> at line 1, column 4 closes no open tag"),
    ({"q": "six", "format": "markdown"}, 400, "markdown format is not supported"),
    ({"q": ""}, 400, "Invalid request: missing q parameter"),
    ({"q": []}, 400, "Invalid request: missing q parameter"),
    ({"q": "six", "format": "xml"}, 400, "xml format is not supported"),
    ({"q": "six", "source": ""}, 400, "missing source parameter"),
    ({"q": "six", "alternatives": "many"}, 400, "alternatives parameter is not a number"),
    ({"q": "six", "alternatives": 40}, 400, "alternatives parameter must be <= 15 (a translation and its "
     "alternatives are one beam search's best, and the server's beam limit is 16: twostep serve --max-beam and "
     "--max-batch-rows)"),
    ({"q": ["six"] * 17}, 400, "17 sentences in one request; at most 16"),
    ({"q": "six " * 6000}, 400, "Invalid request: request (24000) exceeds text limit (20000)"),
])
def test_bad_requests_get_libretranslates_error_shape(demo_server, body, status, message):
    url, _ = demo_server
    r = lt(url, **{"source": "en", "target": "de", **body})
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and message in r.json()["error"], r.text
    assert lt(url, q="six", source="en", target="de").status_code == 200  # nothing else disturbed


@pytest.mark.parametrize("path", ["/translate", "/detect"])
@pytest.mark.parametrize("body", ["[\"six\"]", "{\"q\": ", "\"six\""])
def test_a_body_that_is_no_json_object_is_libretranslates_invalid_json(demo_server, path, body):
    url, _ = demo_server
    r = httpx.post(f"{url}{path}", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert (r.status_code, r.json()) == (400, {"error": "Invalid JSON format"})


def test_api_key_in_the_body_or_the_header(demo_artifact, reference):
    with server(demo_artifact, env={"TWOSTEP_API_KEYS": KEY}) as (url, proc):
        keyed = libretranslatepy.LibreTranslateAPI(url, api_key=KEY)
        assert keyed.translate(SENTENCES[0], "en", "de") == reference["greedy"][0]
        assert keyed.languages() == []
        status, message = refusal(lambda: libretranslatepy.LibreTranslateAPI(url).translate(SENTENCES[0], "en", "de"))
        assert status == 400 and "this server needs an API key" in message
        status, message = refusal(lambda: libretranslatepy.LibreTranslateAPI(url, "wrong").translate("six", "en", "de"))
        assert (status, message) == (403, "Invalid API key")
        assert libretranslatepy.LibreTranslateAPI(url).languages() == []  # open, as LibreTranslate's
        r = httpx.post(f"{url}/translate", json={"q": "six", "source": "en", "target": "de"},
                       headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        assert r.status_code == 200, r.text
        assert post(url, {"text": ["six"]}).status_code == 401  # /v1 still takes the header only
    assert KEY not in "".join(proc.log)


def test_an_argos_package_serves_argostranslates_text(argos_artifact, ct2_models):
    """`twostep serve` on an imported Argos package, as LibreTranslate serves it: its languages listed, and
    LibreTranslate's client and /v1/translate get argostranslate's text with no decoding options."""
    import ct2_models as build

    sentences = ["the cat sat in the park", "hello dog", "a quick fox", "good dog"]
    expected = [text for text, _ in build.argos_reference(ct2_models.argos_dir, sentences)]
    with server(argos_artifact) as (url, proc):
        client = libretranslatepy.LibreTranslateAPI(url)
        assert [(lang["code"], lang["targets"]) for lang in client.languages()] == [("en", ["en", "fr"]),
                                                                                  ("fr", ["fr"])]  # as LibreTranslate
        assert [client.translate(s, "en", "fr") for s in sentences] == [formatted(s, t)
                                                                        for s, t in zip(sentences, expected)]
        answer = post(url, {"text": sentences, "src_lang": "en", "tgt_lang": "fr", "split": False})
        assert answer.status_code == 200, answer.text
        assert [hyps[0]["text"] for hyps in answer.json()["translations"]] == expected
