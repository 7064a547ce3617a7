"""Admission limits (BatchLimits' max_beam, max_new_tokens, max_request_work, and max_batch_rows for a beam):
a request beyond them is refused before it is queued, by the shared BatchingTranslator and so by `twostep serve`
(400, 413 for too much work), and what is admitted stays within `BatchLimits.worst_case_bytes`."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from cli_helpers import assert_user_error, twostep  # noqa: E402
from serving_helpers import post, server  # noqa: E402
from twostep.artifact import load_artifact  # noqa: E402
from twostep.errors import BadInput, TooLarge  # noqa: E402
from twostep.runtime.decoding import DecodeOptions  # noqa: E402
from twostep.serving.executor import open_batching_translator  # noqa: E402
from twostep.serving.limits import BatchLimits  # noqa: E402

SENTENCE, GERMAN = "three hundred and forty-two", "dreihundertzweiundvierzig"
ISSUE = {"text": [SENTENCE], "beam": 10000, "max_new_tokens": 100, "suppress_eos": True}


def refusal(translator, sources, **options) -> str:
    """The message the BatchingTranslator refuses a request with, before anything is queued."""
    with pytest.raises(BadInput) as caught:
        translator.submit_ids(sources, DecodeOptions(**options))
    assert translator.queue_depth == 0
    return str(caught.value)


def test_each_limit_is_refused_at_its_boundary_through_the_python_api(demo_artifact):
    limits = BatchLimits(max_beam=4, max_new_tokens=20, max_request_work=80)
    translator, backend = open_batching_translator(demo_artifact, limits=limits)
    with backend, translator:
        ids = translator.encode([SENTENCE])  # 8 tokens: its default, 2 x 8 + 16 = 32, is capped at 20
        assert translator.decode_ids(ids, DecodeOptions(beam_size=4), timeout=60)  # work 4 x 20: at both limits
        assert "beam size 5 is above the limit of 4 (max_beam; twostep serve --max-beam)" in \
            refusal(translator, ids, beam_size=5)
        assert translator.decode_ids(ids, DecodeOptions(max_new_tokens=20), timeout=60)
        assert "max_new_tokens 21 is above the limit of 20 new tokens a sentence (max_new_tokens; twostep serve " \
            "--max-new-tokens" in refusal(translator, ids, max_new_tokens=21)
        capped = translator.decode_ids(ids, DecodeOptions(suppress_eos=True), timeout=60)
        assert len(capped[0][0].tokens) == 20  # the default, capped, not refused
        eos = [[translator.translator.limits.specials.eos_id]]
        assert len(translator.decode_ids(eos * 80, DecodeOptions(max_new_tokens=1), timeout=60)) == 80  # work 80
        with pytest.raises(TooLarge, match=re.escape("work (beam x new tokens, summed over its sentences) is 1 x 81 "
                                                     "= 81, above the limit of 80 (max_request_work; twostep serve "
                                                     "--max-request-work)")):
            translator.submit_ids(eos * 81, DecodeOptions(max_new_tokens=1))
        # the beam counts: 2 sentences of 14 new tokens are 28, below 80, but with a beam of 3 they are 84
        with pytest.raises(TooLarge, match=re.escape("is 3 x 28 = 84, above the limit of 80")):
            translator.submit_ids(ids * 2, DecodeOptions(beam_size=3, max_new_tokens=14))
        assert translator.queue_depth == 0

    rows = BatchLimits(max_batch_rows=3)  # below max_beam (16): a beam's rows decode in one batch
    translator, backend = open_batching_translator(demo_artifact, limits=rows)
    with backend, translator:
        ids = translator.encode([SENTENCE])
        assert translator.decode_ids(ids, DecodeOptions(beam_size=3), timeout=60)
        assert "beam size 4 takes 4 rows of one batch, which holds 3 (max_batch_rows; twostep serve " \
            "--max-batch-rows; the beam limit max_beam is 16)" in refusal(translator, ids, beam_size=4)


def test_the_default_new_token_limit_is_the_models_max_positions(demo_artifact):
    translator, backend = open_batching_translator(demo_artifact)
    with backend, translator:
        positions = translator.translator.limits.max_positions
        ids = translator.encode([SENTENCE])
        assert translator.decode_ids(ids, DecodeOptions(max_new_tokens=positions), timeout=60)
        assert f"max_new_tokens {positions + 1} is above the limit of {positions} new tokens" in \
            refusal(translator, ids, max_new_tokens=positions + 1)
        assert "above the limit of 16 (max_beam" in refusal(translator, ids, beam_size=17)


def test_the_ray_app_reads_the_admission_limits_by_name():
    from twostep.serving import ray_app

    assert BatchLimits.from_strings({"max_beam": "4", "max_new_tokens": "32", "max_request_work": "1000"}) == \
        BatchLimits(max_beam=4, max_new_tokens=32, max_request_work=1000)
    assert BatchLimits.from_strings({"max_new_tokens": "none"}) == BatchLimits()  # the model's max_positions
    with pytest.raises(BadInput, match=r"max_new_tokens takes a number \(int or none\), got 'many'"):
        BatchLimits.from_strings({"max_new_tokens": "many"})
    # app_builder (`serve run twostep.serving.ray_app:app_builder ...`) reads them before it touches Ray
    with pytest.raises(BadInput, match="max_beam must be positive, got 0; max_request_work must be positive, got 0; "
                                       "max_new_tokens must be positive"):
        ray_app.app_builder({"model_dir": "ART", "max_beam": "0", "max_request_work": "0", "max_new_tokens": "0"})


@pytest.mark.slow
def test_bad_limit_flags_are_one_line_errors(demo_artifact):
    assert_user_error(twostep("serve", demo_artifact, "--port", "0", "--max-beam", "0", "--max-request-work", "-1",
                              "--max-new-tokens", "0"),
                      "max_beam must be positive, got 0", "max_request_work must be positive, got -1",
                      "max_new_tokens must be positive")


def counter(url, name) -> float:
    text = httpx.get(f"{url}/metrics").text
    return next(s.value for f in text_string_to_metric_families(text) if f.name == name
                for s in f.samples if s.name == name + "_total")


@pytest.fixture(scope="module")
def default_server(demo_artifact):
    with server(demo_artifact) as (url, proc):
        yield url, proc


@pytest.mark.slow
def test_the_issues_request_is_refused_at_once_while_others_are_answered(default_server):
    """The issue: beam 10000 x 100 tokens was answered after 154 s at 4.1 GB while every other caller waited."""
    url, _ = default_server
    normal = [{"text": [SENTENCE] * 8, "beam": 4, "suppress_eos": True, "max_new_tokens": 60}]  # decodes a while
    normal += [{"text": [SENTENCE]}, {"text": [SENTENCE], "beam": 4}] * 4
    with httpx.Client(timeout=60) as client, ThreadPoolExecutor(max_workers=len(normal)) as pool:
        assert client.post(f"{url}/v1/translate", json={"text": [SENTENCE]}).status_code == 200  # connected, warm
        answers = [pool.submit(post, url, body) for body in normal]
        deadline = time.monotonic() + 30
        while counter(url, "twostep_batches") < 2 and time.monotonic() < deadline:  # the warm-up's, and theirs
            time.sleep(0.005)
        started = time.monotonic()
        refused = client.post(f"{url}/v1/translate", json=ISSUE)
        seconds = time.monotonic() - started
        running = sum(not a.done() for a in answers)
        replies = [a.result() for a in answers]
    assert refused.status_code == 400 and seconds < 1.0, (refused.text, seconds)
    assert "beam size must be an integer in [1, 256], got 10000" in refused.json()["error"]  # beyond any server's
    assert running > 0, "the other requests were done before the issue's was refused: not beside it"
    assert [r.status_code for r in replies] == [200] * len(normal)
    assert all(len(hyps[0]["tokens"]) == 60 for hyps in replies[0].json()["translations"])
    assert all(r.json()["translations"][0][0]["text"] == GERMAN for r in replies[1:])
    # the defaults at their boundaries: beam 16, and max_new_tokens up to the demo model's 128 positions
    assert post(url, {"text": [SENTENCE], "beam": 16}).status_code == 200
    assert "beam size 17 is above the limit of 16" in post(url, {"text": [SENTENCE], "beam": 17}).json()["error"]
    assert post(url, {"text": [SENTENCE], "max_new_tokens": 128}).status_code == 200
    too_far = post(url, {"text": [SENTENCE], "max_new_tokens": 129})
    assert too_far.status_code == 400 and "max_new_tokens 129 is above the limit of 128" in too_far.json()["error"]


@pytest.mark.slow
def test_the_limit_flags_reach_the_server_and_each_is_refused_at_its_boundary(demo_artifact):
    with server(demo_artifact, "--max-beam", 2, "--max-new-tokens", 20, "--max-request-work", 40) as (url, _):
        assert post(url, {"text": [SENTENCE], "beam": 2, "max_new_tokens": 20}).status_code == 200  # work 40
        beam = post(url, {"text": [SENTENCE], "beam": 3})
        assert beam.status_code == 400 and "beam size 3 is above the limit of 2 (max_beam; twostep serve " \
            "--max-beam)" in beam.json()["error"]
        tokens = post(url, {"text": [SENTENCE], "max_new_tokens": 21})
        assert tokens.status_code == 400 and "max_new_tokens 21 is above the limit of 20 new tokens a sentence " \
            "(max_new_tokens; twostep serve --max-new-tokens" in tokens.json()["error"]
        capped = post(url, {"text": [SENTENCE], "suppress_eos": True})  # its default, 2 x 8 + 16, capped at 20
        assert capped.status_code == 200 and len(capped.json()["translations"][0][0]["tokens"]) == 20
        assert post(url, {"text": ["seven"] * 40, "max_new_tokens": 1}).status_code == 200  # work 40
        work = post(url, {"text": ["seven"] * 41, "max_new_tokens": 1})
        assert work.status_code == 413 and "work (beam x new tokens, summed over its sentences) is 1 x 41 = 41, " \
            "above the limit of 40 (max_request_work; twostep serve --max-request-work)" in work.json()["error"]
    with server(demo_artifact, "--max-batch-rows", 3) as (url, _):  # a beam wider than a batch: refused too
        assert post(url, {"text": [SENTENCE], "beam": 3}).status_code == 200
        wide = post(url, {"text": [SENTENCE], "beam": 4})
        assert wide.status_code == 400 and "which holds 3 (max_batch_rows; twostep serve --max-batch-rows; the " \
            "beam limit max_beam is 16)" in wide.json()["error"]


def memory(pid: int) -> dict[str, int]:
    """The process's resident set now (VmRSS) and at its highest (VmHWM), in bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    return {key: int(re.search(rf"{key}:\s+(\d+) kB", status).group(1)) * 1024 for key in ("VmRSS", "VmHWM")}


@pytest.mark.slow
def test_the_worst_allowed_request_stays_within_the_memory_bound(demo_artifact):
    """Under the defaults the worst request the server admits fills a batch's rows (max_batch_rows), each padded
    to the longest source (max_positions tokens: every row's cross K/V and the encoder's joint run) and decoding
    to the new-token limit: its RSS growth stays within BatchLimits.worst_case_bytes, and exceeds its K/V alone."""
    if not Path("/proc/self/status").is_file():
        pytest.skip("reads the server's memory from /proc (Linux)")
    limits, config = BatchLimits(), load_artifact(demo_artifact).config
    positions = limits.new_tokens(config.max_positions)
    long = [5] * (config.max_positions - 1) + [config.eos_id]
    worst = {"ids": [long] + [[config.eos_id]] * (limits.max_batch_rows - 1), "max_new_tokens": positions,
             "suppress_eos": True}
    with server(demo_artifact) as (url, proc):
        assert post(url, {"text": [SENTENCE], "beam": 4}).status_code == 200  # sessions and arenas warmed up
        before = memory(proc.pid)
        reply = post(url, worst)
        after = memory(proc.pid)
    assert reply.status_code == 200, reply.text
    assert all(len(hyps[0]["tokens"]) == positions for hyps in reply.json()["translations"])
    growth = after["VmHWM"] - before["VmRSS"]
    bound = limits.worst_case_bytes(config)
    kv = limits.max_batch_rows * (positions + config.max_positions) * config.n_decoder_layers * 2 * config.d_model * 4
    mib = {name: f"{value / 2**20:.0f} MiB" for name, value in (("grew", growth), ("K/V", kv), ("bound", bound))}
    assert kv < growth <= bound, mib
