"""`twostep serve`: a real uvicorn process on a free loopback port, driven over HTTP with httpx."""

from __future__ import annotations

import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from cli_helpers import assert_user_error, twostep  # noqa: E402
from serving_helpers import post, server  # noqa: E402
from twostep.runtime.decoding import DecodeOptions  # noqa: E402
from twostep.runtime.translator import open_translator  # noqa: E402
from twostep.serving.api.libretranslate import formatted  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_server(demo_artifact):
    with server(demo_artifact, "--max-sentences", 8, "--max-wait-ms", 10) as (url, proc):
        yield url, proc


@pytest.fixture(scope="module")
def sentences():
    from twostep.model.tasks import get_task

    return [source for source, _ in get_task("numbers-en-de").split("test")][:64]


def test_translations_and_scores_match_the_python_runtime(demo_server, demo_artifact, sentences):
    url, _ = demo_server
    translator, backend = open_translator(demo_artifact, options=DecodeOptions(beam_size=4, n_best=2))
    with backend:
        want = translator.translate_nbest(sentences[:8])
        want_ids = translator.decode_ids(translator.encode(sentences[:8]))
    r = post(url, {"text": sentences[:8], "beam": 4, "n_best": 2})
    assert r.status_code == 200, r.text
    got = r.json()["translations"]
    assert [[h["text"] for h in hyps] for hyps in got] == [[t for t, _ in hyps] for hyps in want]
    assert [h["score"] for hyps in got for h in hyps] == pytest.approx([s for hyps in want for _, s in hyps], abs=1e-4)
    ids = post(url, {"ids": translator.encode(sentences[:8]), "beam": 4, "n_best": 2}).json()["translations"]
    assert [[h["tokens"] for h in hyps] for hyps in ids] == [[h.tokens for h in hyps] for hyps in want_ids]
    assert all("text" not in h for hyps in ids for h in hyps)


def test_concurrent_clients_get_their_own_answers(demo_server, demo_artifact, sentences):
    url, _ = demo_server
    translator, backend = open_translator(demo_artifact)
    with backend:
        want = [translator.translate([s])[0] for s in sentences]
    with ThreadPoolExecutor(max_workers=32) as pool:
        got = list(pool.map(lambda s: post(url, {"text": [s]}), sentences))
    assert [r.status_code for r in got] == [200] * len(sentences)
    assert [r.json()["translations"][0][0]["text"] for r in got] == want


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "the body is not valid JSON"),
    ({"text": "one string"}, 400, "text: Input should be a valid list"),
    ({"text": ["seven"], "beams": 4}, 400, "beams: Extra inputs are not permitted"),
    ({"text": ["seven"], "ids": [[5, 3]]}, 400, "give either text or ids"),
    ({}, 400, "give either text or ids"),
    ({"text": ["seven"], "beam": 0}, 400, "beam size must be an integer in [1, 256]"),
    ({"text": [""]}, 400, "text 1 is empty"),
    ({"text": [""], "split": False}, 400, "sentence 1 is empty"),
    ({"text": ["seven. " * 9]}, 413, "9 sentences in one request; at most 8"),
    ({"ids": [[5, 999, 3]]}, 400, "outside the vocabulary"),
    ({"ids": [[5] * 300 + [3]]}, 400, "max_positions"),
    ({"text": ["seven"] * 9}, 413, "9 sentences in one request; at most 8"),
    ({"text": ["seven " * 5000]}, 413, "characters in one request; at most 20000"),
])
def test_bad_requests_get_one_clear_status_and_message(demo_server, body, status, message):
    url, _ = demo_server
    if isinstance(body, bytes):
        r = httpx.post(f"{url}/v1/translate", content=body, headers={"content-type": "application/json"})
    else:
        r = post(url, body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]


def test_health_readiness_openapi_and_metrics(demo_server, sentences):
    url, proc = demo_server
    assert httpx.get(f"{url}/healthz").json() == {"status": "alive"}
    assert httpx.get(f"{url}/readyz").json() == {"status": "ready", "backend": "ort-cpu"}
    schema = httpx.get(f"{url}/openapi.json").json()
    assert "/v1/translate" in schema["paths"] and "TranslateRequest" in schema["components"]["schemas"]
    post(url, {"text": sentences[:3]})
    post(url, {"text": "bad"})
    text = httpx.get(f"{url}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    by_status = {s.labels["status"]: s.value for s in families["twostep_requests"].samples
                 if s.name == "twostep_requests_total"}
    assert by_status["200"] >= 1 and by_status["400"] >= 1
    assert next(s.value for s in families["twostep_generated_tokens"].samples) > 0
    assert any(s.name == "twostep_batch_rows_count" and s.value >= 1 for s in families["twostep_batch_rows"].samples)
    assert any(s.name == "twostep_request_latency_seconds_count" and s.value >= 1
               for s in families["twostep_request_latency_seconds"].samples)
    assert [s.value for s in families["twostep_queue_depth"].samples] == [0.0]
    assert any(re.search(r"POST /v1/translate 200 [\d.]+ ms", line) for line in proc.log)  # a line per request


def test_overload_is_503_with_retry_after_and_nothing_is_lost(demo_artifact, sentences):
    with server(demo_artifact, "--max-queue", 2, "--max-batch-rows", 4) as (url, _):
        body = {"text": sentences[:2], "beam": 4}
        with ThreadPoolExecutor(max_workers=48) as pool:
            replies = list(pool.map(lambda _: post(url, body), range(96)))
    statuses = [r.status_code for r in replies]
    assert set(statuses) <= {200, 503} and len(statuses) == 96
    assert statuses.count(503) > 0, "96 requests against a queue of 2, and none refused"
    refused = [r for r in replies if r.status_code == 503]
    assert all(r.headers["retry-after"] == "1" and "queue is full" in r.json()["error"] for r in refused)
    assert all(len(r.json()["translations"]) == 2 for r in replies if r.status_code == 200)


def sentences_received(url) -> float:
    """Sentences the server has taken in: those waiting plus those that started a batch or joined one (a
    sentence leaves the queue before it is counted there, so this never counts one twice)."""
    text = httpx.get(f"{url}/metrics").text
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return (values["twostep_queue_depth"] + values["twostep_batch_sentences_total"]
            + values["twostep_joined_sentences_total"])


def test_sigterm_answers_requests_in_flight_then_exits(demo_artifact, sentences):
    long = sorted(sentences, key=len)[-8:]
    with server(demo_artifact, "--max-batch-rows", 4) as (url, proc):
        with ThreadPoolExecutor(max_workers=16) as pool:  # 16 x 8 sentences x 4 beams, one sentence at a time
            futures = [pool.submit(post, url, {"text": long, "beam": 4}) for _ in range(16)]
            # every request must be inside the server before the signal: uvicorn closes its socket on SIGTERM,
            # so a client still connecting then is refused, which is not what this test is about
            deadline = time.monotonic() + 30
            while sentences_received(url) < 16 * len(long) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not all(f.done() for f in futures), "the requests finished before the signal"
            proc.send_signal(signal.SIGTERM)
            replies = [f.result() for f in futures]
        assert proc.wait(60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has drained
    assert [r.status_code for r in replies] == [200] * 16
    assert all(len(r.json()["translations"]) == 8 for r in replies)
    assert any("Shutting down" in line for line in proc.log)
    assert any("twostep.serving INFO stopped" in line for line in proc.log)  # translator closed after the drain


def test_serve_refuses_a_bad_artifact_before_starting(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    assert_user_error(twostep("serve", str(tmp_path), "--port", "0"), "manifest.json")


def counter(url, name) -> float:
    text = httpx.get(f"{url}/metrics").text
    return next(s.value for f in text_string_to_metric_families(text) if f.name == name
                for s in f.samples if s.name == name + "_total")


@pytest.mark.parametrize("batching", ["inflight", "static", "express"])
def test_requests_arriving_during_a_batch_join_it_only_in_flight(demo_artifact, sentences, batching):
    """A long request decodes (8 sentences x beam 4, 120 tokens each); short ones sent meanwhile join its batch
    at the next step with --batching inflight (or decode in the express lane beside it, those of at most 11
    tokens, with --express-tokens 11), and wait for it to end with static. Answers are the same."""
    long = {"text": sorted(sentences, key=len)[-8:], "beam": 4, "suppress_eos": True, "max_new_tokens": 120}
    shorts = [{"text": [s]} for s in sentences[:8]]
    flags = ["--batching", "inflight", "--express-tokens", 11] if batching == "express" else ["--batching", batching]
    with server(demo_artifact, *flags, "--max-wait-ms", 0) as (url, proc):
        with ThreadPoolExecutor(max_workers=9) as pool:
            first = pool.submit(post, url, long)
            deadline = time.monotonic() + 30
            while counter(url, "twostep_batches") < 1 and time.monotonic() < deadline:
                time.sleep(0.005)
            replies = list(pool.map(lambda body: post(url, body), shorts))
            done_first = first.done()
            assert first.result().status_code == 200
        joined, steps = counter(url, "twostep_joined_sentences"), counter(url, "twostep_decoder_steps")
        express = counter(url, "twostep_express_steps")
    assert all(r.status_code == 200 for r in replies)
    # in flight on the plain decoder (demo_artifact has no other), the server said so at start
    assert any("--inplace-cache" in line for line in proc.log) == (batching != "static"), "".join(proc.log)
    translator, backend = open_translator(demo_artifact, "ort-cpu")
    with backend:
        want = translator.translate([s["text"][0] for s in shorts])
    assert [r.json()["translations"][0][0]["text"] for r in replies] == want
    if batching != "static":
        assert not done_first  # the shorts were answered while the long request decoded
        assert (express > 0) == (batching == "express")  # in the express lane, or joining the long one's batch
        assert joined >= 1 or batching == "express"
    else:
        assert joined == 0 and steps >= 120


def test_pretrained_families_translate_per_request_languages_as_transformers_does(pretrained):
    """`src_lang`/`tgt_lang` per request; concurrent requests to different target languages share batches
    (M2M100's, NLLB's and mBART-50's language token is a per-row forced token) and each gets transformers'
    translation."""
    import hf_models
    from conftest import NEW_TOKENS

    requests = [(dict(pretrained.langs), pretrained.greedy[1])]
    if pretrained.other_target:
        other = {**pretrained.langs, "tgt_lang": pretrained.other_target}
        requests.append((other, hf_models.reference(pretrained.hf, hf_models.TEST_SENTENCES, NEW_TOKENS, **other)[1]))
    with server(pretrained.art, "--max-wait-ms", 50) as (url, _):
        def ask(langs):
            texts = []
            for sentence in hf_models.TEST_SENTENCES:  # one request a sentence: they meet in the engine's batches
                r = post(url, {"text": [sentence], "max_new_tokens": NEW_TOKENS, **langs})
                assert r.status_code == 200, r.text
                texts.append(r.json()["translations"][0][0]["text"])
            return texts

        with ThreadPoolExecutor(len(requests)) as pool:
            answers = list(pool.map(ask, [langs for langs, _ in requests]))
        for (_, want), got in zip(requests, answers):
            assert got == want
        # GET /v1/languages: the model's codes, each with its standard tag and English name
        listed = httpx.get(f"{url}/v1/languages", timeout=30)
        assert listed.status_code == 200, listed.text
        src, tgt = pretrained.langs.get("src_lang"), pretrained.langs.get("tgt_lang")
        targets = {t["code"]: t for t in listed.json()["target"]}
        assert (tgt in targets and targets[tgt]["tag"] == "fr" and targets[tgt]["name"] == "French") if tgt else \
            targets == {}
        sources = {s["code"]: s for s in listed.json()["source"]}
        if src:
            assert sources[src]["name"] == "English" and tgt in sources[src]["targets"]
        elif pretrained.name == "madlad":  # any of its languages to any: no source token
            assert set(sources) == set(targets) and all(tgt in s["targets"] for s in sources.values())
        else:
            assert sources == {}
        if tgt:  # standard codes in a request: the same translation
            standard = {"tgt_lang": "fr-FR", **({"src_lang": "en-US"} if src else {})}
            r = post(url, {"text": hf_models.TEST_SENTENCES[:1], "max_new_tokens": NEW_TOKENS, **standard})
            assert r.status_code == 200 and r.json()["translations"][0][0]["text"] == pretrained.greedy[1][0], r.text
        bad = post(url, {"text": ["hello"], "tgt_lang": "xx", **({"src_lang": pretrained.langs["src_lang"]} if
                                                                  "src_lang" in pretrained.langs else {})})
        assert bad.status_code == 400 and "unknown target language 'xx'" in bad.json()["error"]
        clients_agree(url, pretrained)
        if pretrained.other_target and "src_lang" in pretrained.langs:  # a forced target language, none given: the
            # error names the request's field (MADLAD's <2xx> may be typed in the text, as Marian's >>fra<<)
            missing = post(url, {"text": ["hello"], "src_lang": pretrained.langs["src_lang"]})
            assert missing.status_code == 400, missing.text
            assert "needs a target language: tgt_lang one of" in missing.json()["error"]
            assert "--tgt-lang" not in missing.json()["error"]


def clients_agree(url: str, pretrained) -> None:
    """The other clients of the same server: an SSE client's streamed deltas join to transformers' translation of
    every sentence; LibreTranslate's client, with standard codes, gets it too, and lists the languages."""
    import json

    import hf_models
    from conftest import NEW_TOKENS

    httpx_sse = pytest.importorskip("httpx_sse", reason="the SSE client (pip install -e '.[dev]')")
    libretranslatepy = pytest.importorskip("libretranslatepy", reason="LibreTranslate's client (pip install '.[dev]')")
    body = {"text": hf_models.TEST_SENTENCES, "max_new_tokens": NEW_TOKENS, "split": False, "stream": True,
            **pretrained.langs}
    deltas: dict[int, str] = {}
    with httpx.Client(timeout=60) as client, \
            httpx_sse.connect_sse(client, "POST", f"{url}/v1/translate", json=body) as source:
        for event in source.iter_sse():
            if event.event == "delta":
                data = json.loads(event.data)
                deltas[data["text"]] = deltas.get(data["text"], "") + data["delta"]
    assert [deltas.get(i, "") for i in range(len(hf_models.TEST_SENTENCES))] == pretrained.greedy[1]
    if "tgt_lang" not in pretrained.langs:
        return
    client = libretranslatepy.LibreTranslateAPI(url)
    first = hf_models.TEST_SENTENCES[0]  # LibreTranslate's text is formatted like its source
    assert client.translate(first, "en", "fr") == formatted(first, pretrained.greedy[1][0].strip())
    unknown = httpx.post(f"{url}/translate", json={"q": "hello", "source": "en", "target": "xx"}, timeout=60)
    assert unknown.status_code == 400 and unknown.json()["error"] == "xx is not supported"  # LibreTranslate's words
    if pretrained.name == "nllb":  # LibreTranslate's own codes: zt (zh-Hant) is NLLB's zho_Hant; pb (pt-BR) none
        want = post(url, {"text": [first], "src_lang": "eng_Latn", "tgt_lang": "zho_Hant"})
        zt = httpx.post(f"{url}/translate", json={"q": first, "source": "en", "target": "zt"}, timeout=60)
        assert zt.status_code == 200 and want.status_code == 200, (zt.text, want.text)
        assert zt.json()["translatedText"] == formatted(first, want.json()["translations"][0][0]["text"])
        pb = httpx.post(f"{url}/translate", json={"q": first, "source": "en", "target": "pb"}, timeout=60)
        assert (pb.status_code, pb.json()) == (400, {"error": "pb is not supported"})
    listed = {language["code"]: language for language in client.languages()}
    if "src_lang" in pretrained.langs or pretrained.name == "madlad":  # MADLAD: any of its languages to any
        assert listed["en"]["name"] == "English" and "fr" in listed["en"]["targets"]
        auto = httpx.post(f"{url}/translate", json={"q": "The weather is nice today, my friend.", "source": "auto",
                                                    "target": "fr"}, timeout=60)
        assert auto.status_code == 200 and auto.json()["detectedLanguage"]["language"] == "en", auto.text
    else:  # a Marian model of target tokens takes any source text: it lists no sources
        assert listed == {}
