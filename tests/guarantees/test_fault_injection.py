"""Fault injection: exports killed with SIGKILL at random moments, crashes at each step of replacing an
artifact, two exports racing for one directory, a benchmark child that dies, and threads sharing backends,
sessions and translators."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from cli_helpers import assert_user_error, leftovers, twostep
from search import SPECIALS, greedy
from twostep.artifact import load_artifact
from twostep.bench import Workload, bench
from twostep.errors import BadArtifact, SessionBusy
from twostep.exporter.export import export
from twostep.files import OLD, TMP
from twostep.model.checkpoint import save_checkpoint
from twostep.model.config import preset
from twostep.model.transformer import Transformer
from twostep.runtime.backends.ort import OrtBackend
from twostep.runtime.backends.torch_backend import TorchBackend
from twostep.runtime.decoding import DecodeOptions, Specials, decode
from twostep.runtime.translator import open_translator

SOURCES = [[5, 9, 13, 3], [7, 3], [11, 12, 13, 14, 15, 16, 3]]


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    """Two tiny checkpoints with different weights, so that an artifact tells which one it came from."""
    root = tmp_path_factory.mktemp("two")
    out = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        out.append(save_checkpoint(Transformer(preset("tiny", 50, 60, dropout=0.0)), root / f"ck{seed}"))
    return out


def graph_hashes(art) -> dict:
    return json.loads((art / "manifest.json").read_text())["files"]


def assert_whole_and_verifiable(art, ckpt) -> None:
    """Every hash checks, and the graphs decode the same tokens as eager PyTorch on the checkpoint."""
    from twostep.model.checkpoint import load_checkpoint

    artifact = load_artifact(art)
    model = load_checkpoint(ckpt).model
    c = artifact.config
    common = dict(specials=Specials.of(c), max_new_tokens=12)
    with OrtBackend(artifact) as onnx_backend, TorchBackend(model) as eager:
        assert (greedy(onnx_backend.session(), SOURCES, **common)
                == greedy(eager.session(), SOURCES, **common))


def export_cli(ckpt, out, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "twostep.cli", "export", str(ckpt), "--out", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_export_killed_at_random_moments_leaves_one_whole_artifact(tmp_path, two_checkpoints):
    out = tmp_path / "art"
    export(two_checkpoints[0], out)
    hashes = {0: graph_hashes(out)}
    started = time.perf_counter()
    assert export_cli(two_checkpoints[1], out, "--force").wait(timeout=300) == 0
    duration = time.perf_counter() - started
    hashes[1] = graph_hashes(out)
    standing = 1
    rng = random.Random(9)
    kill_points = sorted(rng.uniform(0.05, 1.0) * duration for _ in range(8))
    for delay in kill_points:  # each round tries to replace whichever artifact stands with the other one
        proc = export_cli(two_checkpoints[1 - standing], out, "--force")
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        if not out.exists():  # killed between renaming the old one aside and the new one in
            olds = list(tmp_path.glob(f".art.{OLD}-*"))
            assert len(olds) == 1, f"killed after {delay:.2f}s: no artifact and {olds}"
            load_artifact(olds[0])
            os.rename(olds[0], out)  # what the next run's recovery does (tested below)
        now = [k for k, h in hashes.items() if graph_hashes(out) == h]
        assert now, f"killed after {delay:.2f}s: the artifact is neither the old nor the new one"
        standing = now[0]
        assert_whole_and_verifiable(out, two_checkpoints[standing])
    result = export_cli(two_checkpoints[1 - standing], out, "--force")
    assert result.wait(timeout=300) == 0, result.stderr.read()
    assert_whole_and_verifiable(out, two_checkpoints[1 - standing])
    assert leftovers(tmp_path) == []  # the next run removed every temporary directory the kills left


def test_crash_at_each_step_of_a_replacement_is_repaired_by_the_next_run(tmp_path, two_checkpoints):
    """The states a crash leaves between the steps of replacing an artifact (temporary directory half
    written; old renamed aside, new not yet in; new in, old half removed), each repaired by the next run."""
    out = tmp_path / "art"
    export(two_checkpoints[0], out)
    old = graph_hashes(out)
    # killed while building: a half-written temporary directory
    (tmp_path / f".art.{TMP}-crashed").mkdir()
    (tmp_path / f".art.{TMP}-crashed" / "encoder.onnx").write_bytes(b"half")
    # killed after renaming the old artifact aside, before renaming the new one in: no artifact at all
    os.rename(out, tmp_path / f".art.{OLD}-crashed")
    with pytest.raises(BadArtifact, match="interrupted `twostep export` left the previous artifact"):
        load_artifact(out)
    assert_user_error(twostep("export", two_checkpoints[1], "--out", out), "already holds a twostep artifact")
    assert graph_hashes(out) == old  # the old one was put back, whole, and not replaced without --force
    assert_whole_and_verifiable(out, two_checkpoints[0])
    assert leftovers(tmp_path) == []
    # killed while removing the old artifact after the new one is in (its marker goes first)
    export(two_checkpoints[1], out, force=True)
    half = tmp_path / f".art.{OLD}-half"
    half.mkdir()
    (half / "decoder.onnx").write_bytes(b"what was left")
    export(two_checkpoints[0], out, force=True)
    assert graph_hashes(out) == old and leftovers(tmp_path) == []


@pytest.mark.slow
def test_two_exports_to_one_directory_give_one_artifact_and_one_clear_error(tmp_path, two_checkpoints):
    out = tmp_path / "art"
    procs = [export_cli(ck, out) for ck in two_checkpoints]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert sorted(code for code, _ in results) == [0, 1], results
    winner = [code for code, _ in results].index(0)
    message = results[1 - winner][1]
    assert message.startswith("error: ") and "Traceback" not in message
    assert "another twostep process" in message or "already holds a twostep artifact" in message
    assert_whole_and_verifiable(out, two_checkpoints[winner])
    assert leftovers(tmp_path) == []


def test_bench_reports_a_backend_whose_process_dies_and_finishes(tiny_artifact):
    art, ckpt = tiny_artifact
    killed = []

    def tick():  # the first backend's child dies (SIGKILL, as the OOM killer sends) once it has started
        if not killed:
            for child in multiprocessing.active_children():
                os.kill(child.pid, signal.SIGKILL)
                killed.append(child.pid)

    results = []
    runner = threading.Thread(daemon=True, target=lambda: results.extend(bench(
        ["ort-cpu", "torch"], art, ckpt, [Workload(2, 4, 3), Workload(1, 4, 3)], warmup=1, iters=2, tick=tick)))
    runner.start()
    runner.join(timeout=120)
    assert not runner.is_alive(), "bench still waits for a child that died"
    assert killed
    assert [r.backend for r in results] == ["ort-cpu", "ort-cpu", "torch", "torch"]
    assert all("died (killed by SIGKILL)" in r.error for r in results[:2])
    assert all(r.error is None and r.tokens_per_s > 0 for r in results[2:])


def test_a_translator_shared_by_threads_gives_each_caller_its_own_results(demo_artifact):
    sentences = [["three hundred and forty-two", "seven"], ["nineteen thousand and one"], ["sixty-six", "nine"],
                 ["four hundred thousand"]] * 3
    translator, backend = open_translator(demo_artifact, "ort-cpu", options=DecodeOptions(beam_size=2))
    with backend:
        expected = [translator.translate(s) for s in sentences]
        got = [None] * len(sentences)

        def call(i):
            got[i] = translator.translate(sentences[i])

        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(sentences))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert got == expected


def test_a_step_session_shared_by_threads_refuses_the_second_caller(tiny_artifact):
    artifact = load_artifact(tiny_artifact[0])
    with OrtBackend(artifact) as backend:
        session = backend.session()
        inside, release = threading.Event(), threading.Event()
        step = session.step

        def slow_step(ids):  # the first caller pauses inside its decode
            inside.set()
            release.wait(timeout=30)
            return step(ids)

        session.step = slow_step
        common = dict(specials=SPECIALS, max_new_tokens=5)
        first: list = []
        worker = threading.Thread(target=lambda: first.append(
            decode(session, SOURCES, DecodeOptions(), **common)))
        worker.start()
        assert inside.wait(timeout=30)
        with pytest.raises(SessionBusy, match="decoding in another thread"):
            decode(session, SOURCES, DecodeOptions(), **common)
        release.set()
        worker.join(timeout=60)
        session.step = step
        assert first == [decode(session, SOURCES, DecodeOptions(), **common)]


def test_backend_run_is_safe_from_many_threads(tiny_artifact):
    artifact = load_artifact(tiny_artifact[0])
    rng = np.random.default_rng(0)
    feeds = [{"input_ids": rng.integers(4, 50, (b, s)).astype(np.int64),
              "attention_mask": np.ones((b, s), np.int64)} for b, s in [(1, 3), (2, 9), (3, 5), (4, 2)] * 4]
    with OrtBackend(artifact) as backend:
        expected = [backend.run("encoder", f) for f in feeds]
        got = [None] * len(feeds)

        def call(i):
            got[i] = backend.run("encoder", feeds[i])

        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(feeds))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    for e, g in zip(expected, got):
        assert e.keys() == g.keys() and all(np.array_equal(e[k], g[k]) for k in e)
