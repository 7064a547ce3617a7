"""/v1/translate with documents and streams, on a real `twostep serve`: documents are split into sentences and
joined back with their own whitespace; `"stream": true` answers server-sent events, read with an SSE client
(httpx-sse), whose deltas join to the translation it answers without streaming."""

from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")
httpx_sse = pytest.importorskip("httpx_sse", reason="the SSE client of the streaming tests (pip install -e '.[dev]')")

from serving_helpers import post, server  # noqa: E402
from twostep.runtime.decoding import DecodeOptions  # noqa: E402
from twostep.runtime.translator import open_translator  # noqa: E402

pytestmark = pytest.mark.slow

DOCUMENT = ("three hundred and forty-two. seven thousand and one!\n"
            "nineteen thousand, eight hundred and seven.\n\n"
            "  six hundred and fifty-one thousand, two hundred and ninety-nine. twelve.\n\n\n"
            "four hundred and four.\n")


@pytest.fixture(scope="module")
def demo_server(demo_artifact):
    with server(demo_artifact, "--max-sentences", 16, "--max-chars", 200_000, "--max-wait-ms", 20) as (url, proc):
        yield url, proc


@pytest.fixture(scope="module")
def translator(demo_artifact):
    translator, backend = open_translator(demo_artifact)
    with backend:
        yield translator


def stream(url: str, body: dict) -> tuple[list, list]:
    """A streamed request's events (name, data) and the SSE response's content type."""
    with httpx.Client(timeout=60) as client, \
            httpx_sse.connect_sse(client, "POST", f"{url}/v1/translate", json={**body, "stream": True}) as source:
        source.response.raise_for_status()
        return [(e.event, json.loads(e.data)) for e in source.iter_sse()], source.response.headers["content-type"]


def deltas_joined(events: list) -> dict:
    joined: dict = {}
    for name, data in events:
        if name == "delta":
            key = data["text"], data["sentence"]
            joined[key] = joined.get(key, "") + data["delta"]
    return joined


def test_a_document_comes_back_with_its_paragraphs(demo_server, translator):
    url, _ = demo_server
    r = post(url, {"text": [DOCUMENT, "eleven."]})
    assert r.status_code == 200, r.text
    got = [hyps[0]["text"] for hyps in r.json()["translations"]]
    assert got == translator.translate([DOCUMENT, "eleven."], split=True)
    sentences, _ = translator.split_documents([DOCUMENT])
    assert len(sentences) == 6
    # each sentence alone, joined with the document's own whitespace: paragraphs stay paragraphs
    want = translator.translate(sentences)
    assert got[0] == (f"{want[0]} {want[1]}\n{want[2]}\n\n  {want[3]} {want[4]}\n\n\n{want[5]}\n")
    assert [s["text"] for s in r.json()["translations"][0][0]["sentences"]] == want
    unsplit = post(url, {"text": [DOCUMENT], "split": False}).json()["translations"][0][0]
    assert unsplit["text"] == translator.translate([DOCUMENT])[0] and "sentences" not in unsplit


@pytest.mark.parametrize("options", [{}, {"sampling": True, "temperature": 0.7, "seed": 11}],
                         ids=["greedy", "sampling"])
def test_streamed_deltas_join_to_the_translation_without_streaming(demo_server, options):
    url, _ = demo_server
    texts = [DOCUMENT, "nine hundred and ninety-nine thousand, nine hundred and ninety-nine."]
    plain = post(url, {"text": texts, **options}).json()["translations"]
    events, content_type = stream(url, {"text": texts, **options})
    assert content_type.startswith("text/event-stream")
    want = {}
    for t, hyps in enumerate(plain):
        for j, sentence in enumerate(hyps[0].get("sentences") or [hyps[0]]):
            want[t, j] = sentence["text"].strip()
    assert deltas_joined(events) == want
    assert {(d["text"], d["sentence"]) for name, d in events if name == "delta"} == set(want)  # each as deltas
    done = {(d["text"], d["sentence"]): d["translation"] for name, d in events if name == "sentence"}
    assert done == want
    assert {d["text"]: d["translation"] for name, d in events if name == "text"} == \
        {t: hyps[0]["text"] for t, hyps in enumerate(plain)}
    assert events[-1] == ("end", {})


def test_beam_streams_each_sentence_when_it_finishes(demo_server, translator):
    url, _ = demo_server
    sentences, _ = translator.split_documents([DOCUMENT])
    want = translator.translate_nbest(sentences, DecodeOptions(beam_size=3, n_best=2))
    events, _ = stream(url, {"text": [DOCUMENT], "beam": 3, "n_best": 2})
    assert not deltas_joined(events)
    done = {d["sentence"]: d for name, d in events if name == "sentence"}
    assert [[h["text"] for h in done[j]["hypotheses"]] for j in range(len(sentences))] == \
        [[t for t, _ in hyps] for hyps in want]
    assert [done[j]["score"] for j in range(len(sentences))] == pytest.approx([hyps[0][1] for hyps in want], abs=1e-4)
    names = [name for name, _ in events]
    assert names[-2:] == ["text", "end"] and names.count("sentence") == len(sentences)


@pytest.mark.parametrize("body, status, message", [
    ({"text": [" \n\n "]}, 400, "text 1 is empty"),
    ({"text": ["seven. " * 10_000]}, 413, "10000 sentences in one request; at most 16"),
    ({"text": ["seven. " * 17], "stream": True}, 413, "17 sentences in one request; at most 16"),
    ({"ids": [[5, 3]], "stream": True}, 400, "stream takes text, not ids"),
    ({"text": ["seven."], "stream": True, "tgt_lang": "fr"}, 400, "unknown target language 'fr'"),
])
def test_bad_documents_and_streams_are_refused_before_anything_starts(demo_server, body, status, message):
    url, _ = demo_server
    r = post(url, body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json" and message in r.json()["error"], r.text
    assert post(url, {"text": ["seven. six."]}).status_code == 200  # nothing else disturbed
