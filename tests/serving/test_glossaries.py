"""Glossaries in `twostep serve` (issue 50): stored ones in DeepL's shape (POST/GET/DELETE /v1/glossaries), each
its key's, in the SQLite file of --glossaries; /v1/translate's and LibreTranslate's /translate's `glossary` and
`glossary_id`: a term found is forced (a wrong target on purpose, so that it shows), a text without one answers as
without the glossary, applied and unmet terms per text; one 400 per bad glossary. On a real server with two keys."""

from __future__ import annotations

import json
import sqlite3

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")

from serving_helpers import server  # noqa: E402
from twostep.serving.keys import key_digest  # noqa: E402

ONE, OTHER = "key-one", "key-two"
SEVEN = {"source": "seven", "targets": ["acht"]}


@pytest.fixture(scope="module")
def served(demo_artifact, tmp_path_factory):
    db = tmp_path_factory.mktemp("glossaries") / "glossaries.db"
    with server(demo_artifact, "--glossaries", db, env={"TWOSTEP_API_KEYS": f"{ONE},{OTHER}"}) as (url, proc):
        yield url, db, proc


def call(url, method, path, key=ONE, **kw) -> httpx.Response:
    return httpx.request(method, f"{url}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=60, **kw)


def create(url, key=ONE, **fields) -> httpx.Response:
    body = {"name": "numbers", "source_lang": "en", "target_lang": "de", "entries": "seven\tacht\nthousand\ttausend\n",
            **fields}
    return call(url, "POST", "/v1/glossaries", key, json=body)


def test_a_glossary_is_stored_listed_read_and_deleted_by_its_key_only(served):
    url, db, _ = served
    made = create(url, entries='seven,acht,sieben\n"a, b",c\n', entries_format="csv")
    assert made.status_code == 201, made.text
    info = made.json()
    gid = info.pop("glossary_id")
    assert info.pop("creation_time").endswith("Z")
    assert info == {"name": "numbers", "ready": True, "source_lang": "en", "target_lang": "de", "entry_count": 2}
    assert call(url, "GET", f"/v1/glossaries/{gid}").json() == made.json()
    assert made.json() in call(url, "GET", "/v1/glossaries").json()["glossaries"]
    entries = call(url, "GET", f"/v1/glossaries/{gid}/entries")
    assert entries.headers["content-type"].startswith("text/tab-separated-values")
    assert entries.text == "seven\tacht\tsieben\na, b\tc\n"
    with sqlite3.connect(db) as c:  # the key's digest, never the key
        assert c.execute("SELECT owner FROM glossaries WHERE id = ?", (gid,)).fetchone() == (key_digest(ONE.encode()),)
    # another key neither sees nor uses nor deletes it
    assert gid not in [g["glossary_id"] for g in call(url, "GET", "/v1/glossaries", OTHER).json()["glossaries"]]
    for method, path in (("GET", f"/v1/glossaries/{gid}"), ("GET", f"/v1/glossaries/{gid}/entries"),
                         ("DELETE", f"/v1/glossaries/{gid}")):
        refused = call(url, method, path, OTHER)
        assert refused.status_code == 404 and gid in refused.json()["error"], (method, path)
    used = call(url, "POST", "/v1/translate", OTHER, json={"text": ["seven"], "glossary_id": gid})
    assert used.status_code == 400 and used.json()["error"].startswith(f"no glossary '{gid}'")
    assert call(url, "DELETE", f"/v1/glossaries/{gid}").status_code == 204
    assert call(url, "GET", f"/v1/glossaries/{gid}").status_code == 404
    assert call(url, "DELETE", f"/v1/glossaries/{gid}").status_code == 404


def test_v1_translate_forces_a_glossary_s_terms_and_says_which(served):
    url, _, _ = served
    texts = ["seven thousand", "nine hundred"]
    plain = call(url, "POST", "/v1/translate", json={"text": texts}).json()
    assert set(plain) == {"translations"}  # without a glossary, the answer as ever
    gid = create(url).json()["glossary_id"]
    for glossary in ({"glossary": [SEVEN]}, {"glossary_id": gid}):
        answer = call(url, "POST", "/v1/translate", json={"text": texts, **glossary})
        assert answer.status_code == 200, answer.text
        got = answer.json()
        assert "acht" in got["translations"][0][0]["text"] and "acht" not in plain["translations"][0][0]["text"]
        assert got["translations"][1] == plain["translations"][1]  # no term: as without the glossary
        applied = [SEVEN] + ([{"source": "thousand", "targets": ["tausend"]}] if "glossary_id" in glossary else [])
        assert got["applied_terms"] == [applied, []] and got["unmet_terms"] == [[], []]
    ignored = call(url, "POST", "/v1/translate", json={"text": ["SEVEN"], "glossary": [SEVEN]}).json()
    assert ignored["applied_terms"] == [[]]
    folded = call(url, "POST", "/v1/translate", json={"text": ["SEVEN"], "glossary": [SEVEN],
                                                      "glossary_ignore_case": True}).json()
    assert folded["applied_terms"] == [[SEVEN]]


def test_a_stream_tells_each_text_s_terms_with_its_text_event(served):
    url, _, _ = served
    with httpx.stream("POST", f"{url}/v1/translate", headers={"Authorization": f"Bearer {ONE}"}, timeout=60,
                      json={"text": ["seven thousand", "nine"], "stream": True, "glossary": [SEVEN]}) as response:
        assert response.status_code == 200
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    texts = sorted((e for e in events if "translation" in e and "sentence" not in e), key=lambda e: e["text"])
    assert [(t["text"], t["applied_terms"], t["unmet_terms"]) for t in texts] == [(0, [SEVEN], []), (1, [], [])]
    assert "acht" in texts[0]["translation"]


def test_libretranslate_s_translate_takes_a_glossary_as_tsv_or_by_id(served):
    url, _, _ = served
    plain = call(url, "POST", "/translate", json={"q": "seven", "source": "en", "target": "de"}).json()
    assert set(plain) == {"translatedText"}
    termed = call(url, "POST", "/translate", data={"q": "seven", "source": "en", "target": "de",
                                                   "glossary": "seven\tacht\n"}).json()  # a form: TSV
    assert "acht" in termed["translatedText"] and termed["applied_terms"] == [SEVEN] and termed["unmet_terms"] == []
    gid = create(url).json()["glossary_id"]
    listed = call(url, "POST", "/translate", json={"q": ["seven", "nine"], "source": "en", "target": "de",
                                                   "glossary_id": gid}).json()
    assert listed["applied_terms"] == [[SEVEN], []] and listed["translatedText"][1] == call(
        url, "POST", "/translate", json={"q": "nine", "source": "en", "target": "de"}).json()["translatedText"]
    other = call(url, "POST", "/translate", json={"q": "seven", "source": "en", "target": "fr", "glossary_id": gid})
    assert (other.status_code, other.json()) == (400, {"error": f"glossary {gid} is for en->de; this request "
                                                                "translates en->fr"})


@pytest.mark.parametrize("fields, message", [
    ({"glossary": [{"source": "seven", "targets": ["x"]}], "glossary_id": "g"}, "not both"),
    ({"glossary": [{"source": " ", "targets": ["x"]}]}, "a glossary entry has an empty source term"),
    ({"glossary": [{"source": "seven", "targets": []}]}, "the glossary entry 'seven' has an empty target term"),
    ({"glossary": [{"source": "s" * 257, "targets": ["x"]}]}, "has 257 characters, at most 256 are taken"),
    ({"glossary_id": "no-such"}, "no glossary 'no-such'"),
    ({"glossary": [SEVEN], "sampling": True}, "a glossary needs beam search or greedy decoding, not sampling"),
])
def test_a_bad_glossary_on_v1_translate_is_one_400(served, fields, message):
    url, _, _ = served
    answer = call(url, "POST", "/v1/translate", json={"text": ["seven"], **fields})
    assert answer.status_code == 400 and message in answer.json()["error"], answer.text


@pytest.mark.parametrize("fields, message", [
    ({"entries": "seven\tacht\nnine\n"}, "glossary line 2: a source term, a tab, then its target; got 'nine'"),
    ({"entries": "seven,acht\n", "entries_format": "csv", "target_lang": "en"},
     "a glossary translates between two languages; got en on both sides"),
    ({"entries": ""}, "the glossary has no entries"),
    ({"entries": "seven\tacht\nseven\tsieben\n"}, "the glossary has the source term 'seven' twice"),
    ({"entries_format": "xlsx"}, "entries_format"),
])
def test_a_bad_glossary_is_not_stored(served, fields, message):
    url, _, _ = served
    before = call(url, "GET", "/v1/glossaries").json()
    answer = create(url, **fields)
    assert answer.status_code == 400 and message in answer.json()["error"], answer.text
    assert call(url, "GET", "/v1/glossaries").json() == before
