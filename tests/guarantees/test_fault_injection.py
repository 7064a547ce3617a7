"""Fault injection: exports killed with SIGKILL at random moments and inside their publish window, a crash
at each step of replacing an artifact, two exports racing for one directory, a benchmark child that dies, and
threads sharing backends, sessions and translators."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from cli_helpers import assert_user_error, leftovers, twostep
from search import SPECIALS, greedy
from twostep.artifact import ARTIFACT, load_artifact, sha256_file
from twostep.bench import Workload, bench
from twostep.errors import BadArtifact, SessionBusy
from twostep.exporter.export import export
from twostep.files import OLD, output_directory
from twostep.model.checkpoint import save_checkpoint
from twostep.model.config import preset
from twostep.model.transformer import Transformer
from twostep.runtime.backends.ort import OrtBackend
from twostep.runtime.backends.torch_backend import TorchBackend
from twostep.runtime.decoding import DecodeOptions, Specials, decode
from twostep.runtime.translator import open_translator

SOURCES = [[5, 9, 13, 3], [7, 3], [11, 12, 13, 14, 15, 16, 3]]
CRASH_CHILD = str(Path(__file__).parents[1] / "crash_child.py")


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


def crash_child(kill_at: int, *job) -> subprocess.CompletedProcess:
    """A job killed just before its `kill_at`th filesystem step (tests/crash_child.py)."""
    return subprocess.run([sys.executable, CRASH_CHILD, str(kill_at), *map(str, job)], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def old_and_new(tiny_artifact, tmp_path_factory) -> dict:
    """Two whole artifacts that differ in every file, the old and the new side of a replacement: the tiny
    artifact, and the same with its graphs' doc strings changed and re-hashed."""
    root = tmp_path_factory.mktemp("old-new")
    manifest = json.loads((tiny_artifact[0] / "manifest.json").read_text())
    for side in ("old", "new"):
        (root / side).mkdir()
        for name in manifest["files"]:
            shutil.copyfile(tiny_artifact[0] / name, root / side / name)
        (root / side / "manifest.json").write_text(json.dumps(manifest, indent=2))
    for name in manifest["files"]:
        if name.endswith(".onnx"):
            graph = onnx.load(str(root / "new" / name))
            graph.doc_string = "the new artifact"
            onnx.save(graph, str(root / "new" / name))
    manifest["files"] = {name: sha256_file(root / "new" / name) for name in manifest["files"]}
    (root / "new" / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return {side: root / side for side in ("old", "new")}


def which(art, sides: dict) -> str:
    """The side ("old" or "new") that `art` is, whole: it loads with every hash checked, and holds exactly that
    side's files, byte for byte; anything else (a part, a mix) fails."""
    load_artifact(art)
    held = {p.name: sha256_file(p) for p in art.iterdir()}
    found = [side for side, path in sides.items() if held == {p.name: sha256_file(p) for p in path.iterdir()}]
    assert found, f"{art} is neither the old nor the new artifact, whole: it holds {sorted(held)}"
    return found[0]


def crash_state(out, sides: dict) -> str:
    """What a crash left: "old" or "new" whole at `out`, or "old aside": nothing at `out` and the whole old
    artifact renamed aside (between the two renames of a replacement), which loading `out` points to."""
    if out.exists():
        return which(out, sides)
    asides = list(out.parent.glob(f".{out.name}.{OLD}-*"))
    assert len(asides) == 1, f"no artifact at {out}, and beside it {leftovers(out.parent)}"
    with pytest.raises(BadArtifact, match="interrupted `twostep export` left the previous artifact"):
        load_artifact(out)
    assert which(asides[0], sides) == "old"
    return "old aside"


class Stop(Exception):
    """Ends a run once it has started (and repaired what a crash left)."""


@pytest.mark.slow
def test_export_killed_at_random_moments_leaves_one_whole_artifact(tmp_path, two_checkpoints):
    """`twostep export --force` replacing an artifact, killed with SIGKILL at 2 seeded random moments (nearly
    all of an export is building the new artifact; the next test kills each step of a replacement in turn) and
    at 2 steps inside its publish window (the export kills itself just before renaming the new one in, and
    halfway through removing the old one). Each kill leaves one whole artifact, old or new; where none stands,
    the next run puts the old one back. The test repairs nothing itself. (The plain graphs only, to halve each
    export.)"""
    out = tmp_path / "art"
    export(two_checkpoints[0], out, variants=[])
    hashes = {0: graph_hashes(out)}
    started = time.perf_counter()
    assert export_cli(two_checkpoints[1], out, "--force", "--no-inplace-cache").wait(timeout=300) == 0
    duration = time.perf_counter() - started
    hashes[1] = graph_hashes(out)
    standing = 1
    rng = random.Random(9)
    kills = [("after", rng.uniform(0.05, 1.0) * duration) for _ in range(2)] + [("step", 2), ("step", 5)]
    for how, when in kills:  # each round tries to replace whichever artifact stands with the other one
        ckpt = two_checkpoints[1 - standing]
        if how == "after":
            proc = export_cli(ckpt, out, "--no-inplace-cache", "--force")
            time.sleep(when)
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=60) in (-signal.SIGKILL, 0), proc.stderr.read()
        else:
            killed = crash_child(when, "cli", "export", ckpt, "--out", out, "--no-inplace-cache", "--force")
            assert killed.returncode == -signal.SIGKILL, killed.stderr  # it reached its publish window
            assert out.exists() == (when != 2)  # step 2 is renaming the new one in
        if not out.exists():  # the old one is aside: the next run (here without --force, refused) puts it back
            assert_user_error(twostep("export", ckpt, "--out", out, "--no-inplace-cache"),
                              "already holds a twostep artifact")
        now = [k for k, h in hashes.items() if graph_hashes(out) == h]
        assert now, f"killed {how} {when}: the artifact is neither the old nor the new one"
        standing = now[0]
        assert_whole_and_verifiable(out, two_checkpoints[standing])
    result = export_cli(two_checkpoints[1 - standing], out, "--force", "--no-inplace-cache")
    assert result.wait(timeout=300) == 0, result.stderr.read()
    assert_whole_and_verifiable(out, two_checkpoints[1 - standing])
    assert leftovers(tmp_path) == []  # the next run removed every temporary directory the kills left


def test_crash_at_each_step_of_a_replacement_is_repaired_by_the_next_run(tmp_path, old_and_new):
    """A replacement killed (SIGKILL) just before each of its filesystem steps in turn: writing the new
    artifact, renaming the old one aside, renaming the new one in, removing the old one file by file, removing
    the lock. Each crash leaves one whole artifact, old or new (between the two renames: the old one, aside);
    the next run that writes there puts it back and removes everything else."""
    out = tmp_path / "out" / "art"
    states = []
    for kill_at in range(1, 50):
        shutil.rmtree(out.parent, ignore_errors=True)
        out.parent.mkdir()
        shutil.copytree(old_and_new["old"], out)
        proc = crash_child(kill_at, "copy", old_and_new["new"], out)
        if proc.returncode == 0:  # fewer steps than kill_at: the replacement ran to its end
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        state = crash_state(out, old_and_new)
        with pytest.raises(Stop):  # the next run that writes `out`, stopped as soon as it has started
            with output_directory(out, ARTIFACT, force=True):
                raise Stop
        assert which(out, old_and_new) == ("new" if state == "new" else "old"), f"killed at step {kill_at}"
        assert leftovers(out.parent) == [], f"killed at step {kill_at}"
        states.append(state)
    assert which(out, old_and_new) == "new" and leftovers(out.parent) == []
    order = ["old", "old aside", "new"]
    assert set(states) == set(order) and states == sorted(states, key=order.index), states


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
        step = session.search_step

        def slow_step(ids, need_logits=True):  # the first caller pauses inside its decode
            inside.set()
            release.wait(timeout=30)
            return step(ids, need_logits)

        session.search_step = slow_step
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
        session.search_step = step
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
