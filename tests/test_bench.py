"""`twostep bench`: every requested backend is measured or reported unavailable; numbers are plausible.
(Speed itself is measured by benchmarks, never asserted in tests.)"""

from __future__ import annotations

import json

from cli_helpers import assert_user_error, twostep
from twostep.bench import Workload, make_sources


def test_bench_reports_every_backend(tiny_artifact):
    art, ckpt = tiny_artifact
    result = twostep("bench", art, "--backend", "ort-cpu,torch,ort-cuda", "--checkpoint", ckpt, "--batch", "1,3",
                     "--src-len", "5", "--new-tokens", "4", "--warmup", "1", "--iters", "2", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [(r["backend"], r["workload"]["batch"]) for r in rows] == [
        ("ort-cpu", 1), ("ort-cpu", 3), ("torch", 1), ("torch", 3), ("ort-cuda", 1), ("ort-cuda", 3)]
    for r in rows[:4]:
        assert r["error"] is None and r["iters"] == 2
        assert r["tokens_per_s"] > 0 and r["ms_per_step"] > 0 and r["encoder_ms"] > 0 and r["peak_rss_mb"] > 10
        assert r["latency_ms"]["p50"] <= r["latency_ms"]["p95"] <= r["latency_ms"]["p99"]
    cuda = rows[4]
    if cuda["error"] is not None:  # no GPU here: reported, not dropped
        assert "not available here" in cuda["error"]


def test_bench_table_and_ratio(tiny_artifact):
    art, ckpt = tiny_artifact
    result = twostep("bench", art, "--backend", "ort-cpu,torch", "--checkpoint", ckpt, "--batch", "2",
                     "--src-len", "4", "--new-tokens", "3", "--warmup", "0", "--iters", "1")
    assert result.returncode == 0, result.stderr
    assert "1.00x" in result.stdout and "torch" in result.stdout and "tokens/s" in result.stdout


def test_torch_without_checkpoint_is_reported(tiny_artifact):
    result = twostep("bench", tiny_artifact[0], "--backend", "torch", "--batch", "1", "--new-tokens", "2",
                     "--iters", "1", "--warmup", "0", "--json")
    assert result.returncode == 0, result.stderr
    assert "needs the checkpoint" in json.loads(result.stdout)[0]["error"]


def test_bad_bench_flags(tiny_artifact):
    assert_user_error(twostep("bench", tiny_artifact[0], "--batch", "1,x"), "--batch takes comma-separated integers")
    assert_user_error(twostep("bench", tiny_artifact[0], "--new-tokens", "1000"), "at most max_positions 64")


def test_same_sources_for_every_backend():
    a = make_sources(100, 3, 4, 8)
    assert a == make_sources(100, 3, 4, 8) and len(a) == 4
    assert all(len(s) == 8 and s[-1] == 3 and min(s[:-1]) >= 4 for s in a)
    assert Workload(32).label == "batch 32, src 32, 64 new"


def test_bench_runs_both_decoders_side_by_side_and_refuses_a_bad_suffix(demo_inplace):
    proc = twostep("bench", demo_inplace.path, "--backend", "ort-cpu:inplace,ort-cpu:concat", "--batch", "2",
               "--new-tokens", "40", "--warmup", "0", "--iters", "1", "--beam", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["backend"] for r in rows] == ["ort-cpu:inplace", "ort-cpu:concat"]
    assert all(r["error"] is None and r["tokens_per_s"] > 0 for r in rows)
    assert [r["decoder"] for r in rows] == ["decoder_inplace", "decoder"]  # what each backend chose, reported
    assert_user_error(twostep("bench", demo_inplace.path, "--backend", "ort-cuda:inplace"),
                      "only ort-cpu takes a decoder suffix")
