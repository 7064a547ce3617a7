"""The in-place decoder (twostep export --inplace-cache): ONNX Runtime's GroupQueryAttention writing the cache
into one buffer. It must decode what eager PyTorch decodes, to the last token, through every way a decode
moves its rows (beams trading places, sentences leaving, the buffer growing), and leave the two plain graphs
and every other consumer of the artifact as they were."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from test_cli import assert_user_error, twostep
from twostep.artifact import load_artifact
from twostep.errors import BadArtifact, BadInput
from twostep.artifact.spec import INPLACE, INPLACE_FILE
from twostep.exporter.validate import compare_sessions
from twostep.model.checkpoint import load_checkpoint, save_checkpoint
from twostep.model.config import preset
from twostep.model.transformer import Transformer
from twostep.runtime.backends.inplace import FIRST_CAPACITY, InplaceSession
from twostep.runtime.backends.ort import OrtBackend
from twostep.runtime.backends.torch_backend import TorchBackend
from twostep.runtime.decoding import DecodeOptions
from twostep.runtime.translator import Limits, Translator
from twostep.verify import test_sources as split_sources


def test_export_adds_the_variant_beside_unchanged_plain_graphs(demo_inplace, demo_artifact):
    art = load_artifact(demo_inplace.path)
    plain = load_artifact(demo_artifact)
    assert art.graphs == plain.graphs  # the contract of TensorRT, C++ and other runtimes is untouched
    assert art.manifest.to_json()["graphs"] == plain.manifest.to_json()["graphs"]
    assert list(art.variants) == [INPLACE]
    entry = art.manifest.to_json()["variants"][INPLACE]
    assert entry["file"] == INPLACE_FILE and entry["file"] in art.manifest.files
    assert entry["ops"] == ["com.microsoft.GroupQueryAttention"]
    assert [t["shape"] for t in entry["inputs"] if t["name"] == "past_key_self_0"] == [["batch", 4, "capacity", 32]]
    # validated step by step at export, within fp32 tolerance
    assert 0 < demo_inplace.report.max_error["decoder_inplace.logits"] < 1e-4
    with OrtBackend(art) as backend:
        assert isinstance(backend.session(), InplaceSession)
        assert "decoder" not in backend.sessions  # the plain decoder's weights are not held twice
    shown = twostep("inspect", demo_inplace.path)
    assert shown.returncode == 0 and "decoder_inplace (decoder_inplace.onnx; ONNX Runtime only" in shown.stdout
    with OrtBackend(art, kv_cache="concat") as backend:
        assert not isinstance(backend.session(), InplaceSession)


@pytest.mark.parametrize("beam", [1, 4])
def test_decodes_the_whole_test_split_like_eager_pytorch(demo_inplace, demo_model_dir, beam):
    art = load_artifact(demo_inplace.path)
    sources = split_sources(art, None)
    options = DecodeOptions(beam_size=beam, n_best=min(beam, 2))
    with OrtBackend(art) as inplace, OrtBackend(art, kv_cache="concat") as concat, \
            TorchBackend(load_checkpoint(demo_model_dir).model) as eager:
        model_limits = Limits.of(art.config, art.config.max_positions)
        runs = [Translator(b.session(), model_limits, batch_size=32, options=options).decode_ids(sources)
                for b in (inplace, concat, eager)]
    tokens = [[[h.tokens for h in hyps] for hyps in run] for run in runs]
    assert len(sources) == 1000
    assert tokens[0] == tokens[2], "in-place decoder differs from eager PyTorch"
    assert tokens[1] == tokens[2]
    for got, want in zip(runs[0], runs[2]):  # the scores agree to float32 noise
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-4)


def test_sessions_agree_with_eager_through_reorders_leaving_rows_and_growth(demo_inplace, demo_model_dir):
    """compare_sessions is what export and verify run; here with a failure shown to be possible."""
    art = load_artifact(demo_inplace.path)
    with OrtBackend(art) as candidate, TorchBackend(load_checkpoint(demo_model_dir).model) as reference:
        report = compare_sessions(candidate, reference, "fp32")
        assert report.ok, report.failures
        assert report.cases == 6 and report.max_error["decoder_inplace.logits"] < 1e-4
        assert 38 + 3 > FIRST_CAPACITY  # the schedule outgrows the first buffer

        class Broken(InplaceSession):  # a reorder that forgets the cache: the check must see it
            def reorder(self, origin, cache_only=False):
                if not cache_only:
                    super().reorder(origin, cache_only)

        broken = type("B", (), {"session": lambda self: Broken(candidate), "config": candidate.config, "decoder": candidate.decoder})()
        assert not compare_sessions(broken, reference, "fp32").ok


def test_buffer_grows_to_max_positions_and_no_further(demo_inplace):
    art = load_artifact(demo_inplace.path)
    with OrtBackend(art) as backend:
        session = backend.session()
        session.start(np.array([[5, 6, 3], [7, 3, 0]]), np.array([[1, 1, 1], [1, 1, 0]]))
        steps = art.config.max_positions
        capacities = []
        for _ in range(steps):
            logits = session.step(np.array([[9], [10]]))
            capacities.append(session.capacity)
        assert np.isfinite(logits).all()
        assert sorted(set(capacities)) == [32, 64, 128] and session.capacity == art.config.max_positions
        with pytest.raises(BadInput, match="max_positions"):
            session.step(np.array([[9], [10]]))


def test_more_than_one_new_token_after_a_past_is_a_bad_input(demo_inplace):
    with OrtBackend(load_artifact(demo_inplace.path)) as backend:
        session = backend.session()
        session.start(np.array([[5, 6, 3], [7, 3, 0]]), np.array([[1, 1, 1], [1, 1, 0]]))
        assert session.step(np.array([[2, 9, 9], [2, 10, 10]])).shape == (2, art_vocab(backend))  # a first step may
        with pytest.raises(BadInput, match="one new token per step"):
            session.step(np.array([[9, 9], [10, 10]]))


def art_vocab(backend) -> int:
    return backend.config.tgt_vocab_size


def test_kv_cache_choices(demo_inplace, demo_artifact):
    with pytest.raises(BadInput, match="--inplace-cache"):
        OrtBackend(load_artifact(demo_artifact), kv_cache="inplace")
    with pytest.raises(BadInput, match="choose one of auto, inplace, concat"):
        OrtBackend(load_artifact(demo_inplace.path), kv_cache="fast")
    with OrtBackend(load_artifact(demo_artifact)) as plain:  # auto: the plain decoder where there is no variant
        assert not plain.inplace and INPLACE not in plain.sessions


def copy_of(result, tmp_path):
    dst = tmp_path / "art"
    shutil.copytree(result.path, dst)
    return dst


def test_a_tampered_variant_is_refused(demo_inplace, tmp_path):
    art = copy_of(demo_inplace, tmp_path)
    data = bytearray((art / INPLACE_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (art / INPLACE_FILE).write_bytes(bytes(data))
    with pytest.raises(BadArtifact, match="sha256 does not match"):
        load_artifact(art)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["variants"][INPLACE]["inputs"].pop(2), "inputs/outputs are not those"),
    (lambda m: m["files"].pop(INPLACE_FILE), "not listed in 'files'"),
    (lambda m: m["variants"][INPLACE].update(file="../elsewhere.onnx"), "plain relative path"),
    (lambda m: m.update(variants=[]), "'variants' is list"),
])
def test_a_wrong_variant_entry_is_refused(demo_inplace, tmp_path, edit, message):
    art = copy_of(demo_inplace, tmp_path)
    manifest = json.loads((art / "manifest.json").read_text())
    edit(manifest)
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BadArtifact, match=message):
        load_artifact(art)


def test_an_unknown_variant_from_a_newer_twostep_is_ignored(demo_inplace, tmp_path):
    art = copy_of(demo_inplace, tmp_path)
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["variants"]["decoder_someday"] = {"file": "someday.onnx"}
    (art / "manifest.json").write_text(json.dumps(manifest))
    assert list(load_artifact(art).variants) == [INPLACE]


def test_int8_in_place_decoder_agrees_with_fp32_eager(tmp_path, demo_model_dir):
    from twostep.exporter.export import export
    from twostep.verify import verify

    result = export(demo_model_dir, tmp_path / "int8", dtype="int8", variants=["decoder_inplace"])
    report = verify(result.path, demo_model_dir, limit=300)
    assert report.ok, report.to_dict()
    assert "decoder_inplace.logits" in report.graphs.max_error


def test_models_the_kernel_cannot_run_are_refused_with_the_reason(tmp_path):
    torch.manual_seed(0)
    ckpt = save_checkpoint(Transformer(preset("tiny", 50, 60, d_model=16, dropout=0.0)), tmp_path / "ckpt")
    assert_user_error(twostep("export", ckpt, "--out", tmp_path / "art", "--inplace-cache"),
                      "head size 4 is not a multiple of 8")
    assert not (tmp_path / "art").exists()


def test_bench_runs_both_decoders_side_by_side_and_refuses_a_bad_suffix(demo_inplace):
    proc = twostep("bench", demo_inplace.path, "--backend", "ort-cpu:inplace,ort-cpu:concat", "--batch", "2",
               "--new-tokens", "40", "--warmup", "0", "--iters", "1", "--beam", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["backend"] for r in rows] == ["ort-cpu:inplace", "ort-cpu:concat"]
    assert all(r["error"] is None and r["tokens_per_s"] > 0 for r in rows)
    assert_user_error(twostep("bench", demo_inplace.path, "--backend", "ort-cuda:inplace"),
                      "only ort-cpu takes a decoder suffix")



@pytest.mark.parametrize("beam", [1, 4])
def test_the_batching_executor_decodes_with_it_as_sentences_come_and_leave(demo_inplace, demo_model_dir, beam):
    """Served traffic: requests of one sentence each, of mixed lengths, arriving together, so that rows leave
    the in-place buffers as their sentences finish; each answer is eager PyTorch's."""
    from concurrent.futures import ThreadPoolExecutor

    from twostep.serving.executor import BatchingTranslator, BatchLimits

    art = load_artifact(demo_inplace.path)
    sources = split_sources(art, 64)
    options = DecodeOptions(beam_size=beam)
    model_limits = Limits.of(art.config, art.config.max_positions)
    with TorchBackend(load_checkpoint(demo_model_dir).model) as eager:
        want = Translator(eager.session(), model_limits, batch_size=64, options=options).decode_ids(sources)
    with OrtBackend(art, threads=2) as backend:
        assert backend.inplace
        ex = BatchingTranslator(backend.session(), model_limits, limits=BatchLimits(max_wait_ms=50, inflight=True),
                                options=options)
        with ex, ThreadPoolExecutor(max_workers=16) as pool:
            got = list(pool.map(lambda s: ex.decode_ids([s])[0], sources))
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
