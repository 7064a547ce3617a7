"""The web page at / (twostep/serving/web/), in a real headless Chromium (Debian's, driven by playwright) against a
real `twostep serve` of Argos pairs: what it shows is what POST /translate answers for the same request, as one
types (debounced: a pause sends one request), with the source detected, the languages swapped, the URL's
?source=&target=&q= read and kept, and the character limit counted. Skipped where /usr/bin/chromium is absent (CI
installs it: .ci/run)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")
pytest.importorskip("lingua", reason="detection needs its extra (pip install -e '.[serve]')")

from serving_helpers import server  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
# never `playwright install`: Debian's Chromium, offline
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CHAR_LIMIT = 300
ENGLISH = "The weather is nice today, and I would like a cup of coffee."
GERMAN = "Das Wetter ist heute sehr schön, und ich möchte eine Tasse Kaffee trinken."
SCREENSHOT = Path(__file__).parents[2] / "docs" / "images" / "web-page.png"


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    playwright = pytest.importorskip("playwright.sync_api", reason="the page is driven by playwright "
                                     "(pip install -e '.[dev]')")
    with playwright.sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def served(argos_pairs, tmp_path_factory):
    """en -> fr, de -> en, en -> es (argos_pairs), and es -> en: en_es's artifact with its pair turned round, so
    that one pair swaps (the same weights under another pair's names, as argos_pairs makes its pairs)."""
    root = tmp_path_factory.mktemp("web")
    for (source, target), art in argos_pairs.items():
        shutil.copytree(art, root / f"{source}_{target}")
    turned(root / "en_es", root / "es_en")
    with server(root, "--char-limit", CHAR_LIMIT) as (url, _):
        yield url


def turned(art: Path, out: Path) -> None:
    """A copy of a bilingual artifact `art` that names its pair the other way round (its manifest's languages)."""
    shutil.copytree(art, out)
    manifest = json.loads((out / "manifest.json").read_text())
    languages = manifest["tokenizer"]["languages"]
    (source, _), (target, tokens) = *languages["source"].items(), *languages["target"].items()
    languages.update(source={target: list(tokens["source"])}, target={source: {"source": [], "decoder": []}},
                     default_source=target, default_target=source)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))


def translated(url: str, q: str, source: str, target: str) -> dict:
    """POST /translate's answer, as the page asks it (with its alternatives)."""
    r = httpx.post(f"{url}/translate", json={"q": q, "source": source, "target": target, "format": "text",
                                             "alternatives": 3}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def shown(page, text: str) -> None:
    """Wait until the page shows `text` as the translation."""
    from playwright.sync_api import TimeoutError

    try:
        page.wait_for_function("text => document.getElementById('translation').textContent === text", arg=text,
                               timeout=15_000)
    except TimeoutError:
        pytest.fail(f"after 15 s the page shows {page.inner_text('#translation')!r} ({page.inner_text('#error')!r}); "
                    f"POST /translate answers {text!r}")


@pytest.mark.slow
def test_the_page_translates_as_one_types(served, browser):
    url = served
    page = browser.new_page(viewport={"width": 900, "height": 560})
    errors = []
    page.on("pageerror", lambda exc: errors.append(exc))
    asked = []
    page.on("request", lambda r: r.url.endswith("/translate") and asked.append(r.post_data_json))

    # the URL's parameters are read at load
    page.goto(f"{url}/?source=en&target=es&q={ENGLISH.replace(' ', '+')}")
    expected = translated(url, ENGLISH, "en", "es")
    shown(page, expected["translatedText"])
    assert (page.input_value("#source"), page.input_value("#target"), page.input_value("#q")) == ("en", "es", ENGLISH)
    alternatives = page.locator("#alternatives button").all_inner_texts()
    assert alternatives == expected["alternatives"]
    assert page.inner_text("#count") == f"{len(ENGLISH)} / {CHAR_LIMIT}"

    # typing: one request once the typing pauses, not one a key; the URL follows
    page.fill("#q", "")
    asked.clear()
    typed = "I would like a cup of coffee."
    page.locator("#q").press_sequentially(typed, delay=20)
    shown(page, translated(url, typed, "en", "es")["translatedText"])
    assert asked[-1]["q"] == typed and len(asked) <= 3, [a["q"] for a in asked]  # 29 keys
    assert page.inner_text("#count") == f"{len(typed)} / {CHAR_LIMIT}"
    assert "q=I+would+like+a+cup+of+coffee." in page.url and "source=en" in page.url and "target=es" in page.url

    # swap: the languages change places, the translation becomes the text
    before = page.inner_text("#translation")
    page.click("#swap")
    assert (page.input_value("#source"), page.input_value("#target"), page.input_value("#q")) == ("es", "en", before)
    shown(page, translated(url, before, "es", "en")["translatedText"])
    assert "source=es" in page.url and "target=en" in page.url

    # auto: the detected language and its confidence, as /translate answers them
    page.select_option("#source", "auto")
    page.select_option("#target", "fr")
    page.fill("#q", GERMAN)
    expected = translated(url, GERMAN, "auto", "fr")
    shown(page, expected["translatedText"])
    detected = expected["detectedLanguage"]
    assert detected["language"] == "de"
    said = re.fullmatch(r"Detected: German \((\d+)%\)", page.inner_text("#detected"))
    assert said and abs(int(said[1]) - detected["confidence"]) <= 0.5, page.inner_text("#detected")

    # the character limit: the counter says so, and the text stops there
    page.fill("#q", "")
    page.locator("#q").press_sequentially("x" * 5)
    page.keyboard.insert_text("y" * (CHAR_LIMIT + 20))
    assert len(page.input_value("#q")) == CHAR_LIMIT
    assert page.inner_text("#count") == f"{CHAR_LIMIT} / {CHAR_LIMIT}"
    assert errors == []
    page.close()


@pytest.mark.slow
def test_the_key_field_and_the_file_form_follow_the_settings(served, browser):
    """Where /frontend/settings says keyRequired and filesTranslation (this server says neither: its answer is
    changed on the way), the page asks for a key, sends it as api_key, and posts a file to /translate_file
    (answered here: the endpoint is not this test's) with the languages and the key, offering the answer's
    translatedFileUrl."""
    url = served
    page = browser.new_page()

    def settings(route):
        answer = route.fetch().json()
        route.fulfill(json={**answer, "keyRequired": True, "filesTranslation": True, "supportedFilesFormat": [".txt"]})

    posted = []

    def translate_file(route):
        posted.append(route.request)
        route.fulfill(json={"translatedFileUrl": f"{url}/files/hello.es.txt"})

    page.route("**/frontend/settings", settings)
    page.route("**/translate_file", translate_file)
    page.goto(f"{url}/?source=en&target=es")
    page.wait_for_selector("#key", state="visible")
    assert page.get_attribute("#file-input", "accept") == ".txt"
    page.fill("#api-key", "a key")
    with page.expect_request("**/translate") as request:
        page.locator("#q").press_sequentially("Hello.")
    assert request.value.post_data_json["api_key"] == "a key"
    page.set_input_files("#file-input", files=[{"name": "hello.txt", "mimeType": "text/plain", "buffer": b"Hello."}])
    page.click("#file button")
    page.wait_for_selector("#download", state="visible")
    assert page.get_attribute("#download", "href") == f"{url}/files/hello.es.txt"
    body = posted[0].post_data_buffer
    for name, value in (("source", b"en"), ("target", b"es"), ("api_key", b"a key")):
        assert f'name="{name}"\r\n\r\n'.encode() + value in body, body
    assert b'name="file"; filename="hello.txt"' in body and b"\r\n\r\nHello.\r\n" in body
    page.close()


@pytest.mark.slow
def test_a_file_goes_through_the_page_and_comes_back_translated(served, browser):
    """The file form against the server's own /translate_file: a text file uploaded from the page comes back, by
    the page's download link, with each line as POST /translate answers it."""
    url = served
    lines = [ENGLISH, "I would like a cup of coffee."]
    page = browser.new_page()
    page.goto(f"{url}/?source=en&target=es")
    page.wait_for_selector("#file", state="visible")
    page.set_input_files("#file-input", files=[{"name": "note.txt", "mimeType": "text/plain",
                                                "buffer": "\n".join(lines).encode() + b"\n"}])
    page.click("#file button")
    page.wait_for_selector("#download", state="visible")
    link = page.get_attribute("#download", "href")
    page.close()
    got = httpx.get(link if link.startswith("http") else f"{url}{link}", timeout=60)
    assert got.status_code == 200, got.text
    assert got.text.splitlines() == [translated(url, line, "en", "es")["translatedText"] for line in lines]


def test_the_page_is_open_and_not_in_the_api_document_on_a_server_with_keys(monkeypatch):
    """The page and what it loads need no key (it asks for one where the server has keys); the API document lists
    the APIs alone. The app in-process, its models never opened: the page needs none."""
    from fastapi.testclient import TestClient

    from twostep.serving.http import API_KEYS_ENV, ServeConfig, build_app, read_api_keys

    monkeypatch.setenv(API_KEYS_ENV, "a key")
    client = TestClient(build_app(ServeConfig(("no-model",), api_key_digests=read_api_keys())))
    page = client.get("/")
    assert page.status_code == 200 and '<meta name="viewport"' in page.text
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        r = client.get(f"/static/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind), (name, r.status_code)
    assert client.get("/v1/languages").status_code == 401
    paths = client.get("/openapi.json").json()["paths"]
    assert "/translate" in paths and not [path for path in paths if path == "/" or path.startswith("/static")]
