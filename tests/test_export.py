"""Export and verify on the demo model: whole decoded sequences identical to eager PyTorch."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from twostep.artifact import load_artifact
from twostep.errors import ParityFailure
from twostep.exporter import validate
from twostep.exporter.export import export
from twostep.verify import verify
from test_cli import twostep


def test_manifest_describes_the_artifact(demo_artifact, demo_model_dir):
    m = json.loads((demo_artifact / "manifest.json").read_text())
    assert m["schema_version"] == 2 and m["dtype"] == "float32" and m["opset"] == 18
    assert set(m["files"]) == {"encoder.onnx", "decoder.onnx", "tokenizer.model"}
    assert m["special_tokens"] == {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
    dec = {t["name"]: t for t in m["graphs"]["decoder"]["inputs"]}
    assert dec["past_key_self_0"]["shape"] == ["batch", 4, "past_len", 32]
    assert m["validation"]["tolerances"]["logits"] == [1e-4, 1e-4]
    assert all(err < 1e-4 for err in m["validation"]["max_error"].values())
    assert {"torch", "onnx", "onnxruntime"} <= set(m["exporter"]["versions"])


def test_graph_dims_are_symbolic(demo_artifact):
    model = onnx.load(str(demo_artifact / "decoder.onnx"))
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*model.graph.input, *model.graph.output]}
    assert dims["input_ids"] == ["batch", "new_len"]
    assert dims["past_value_self_2"] == ["batch", 4, "past_len", 32]
    assert dims["present_key_self_0"] == ["batch", 4, "past_len + new_len", 32]
    assert not any(node.op_type == "If" for node in model.graph.node)  # one graph for every step


def test_ort_cpu_greedy_and_beam4_identical_on_the_whole_test_split(demo_artifact, demo_model_dir):
    report = verify(demo_artifact, demo_model_dir, "ort-cpu", beam_size=4)
    assert report.graphs.ok, report.graphs.failures[:3]
    assert [(s.mode, s.sentences) for s in report.sequences] == [("greedy", 1000), ("beam4", 1000)]
    assert all(s.identical == s.sentences for s in report.sequences), [s.first_mismatch for s in report.sequences]
    assert report.ok


def test_verify_cli_exits_0_and_1_when_a_graph_is_tampered(demo_artifact, demo_model_dir, tmp_path):
    ok = twostep("verify", demo_artifact, "--checkpoint", demo_model_dir, "--limit", "50", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["ok"] is True

    # A tampered decoder whose manifest hash was updated too: it loads, runs and gives wrong numbers.
    tampered = tmp_path / "tampered"
    tampered.mkdir()
    for f in demo_artifact.iterdir():
        (tampered / f.name).write_bytes(f.read_bytes())
    model = onnx.load(str(tampered / "decoder.onnx"))
    init = max((t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT),
               key=lambda t: int(np.prod(t.dims)))
    array = onnx.numpy_helper.to_array(init).copy()
    array.flat[: array.size // 10] *= -1.0
    init.CopyFrom(onnx.numpy_helper.from_array(array, init.name))
    onnx.save(model, str(tampered / "decoder.onnx"))
    manifest = json.loads((tampered / "manifest.json").read_text())
    from twostep.artifact import sha256_file

    manifest["files"]["decoder.onnx"] = sha256_file(tampered / "decoder.onnx")
    (tampered / "manifest.json").write_text(json.dumps(manifest))
    bad = twostep("verify", tampered, "--checkpoint", demo_model_dir, "--limit", "50")
    assert bad.returncode == 1
    assert "verification failed" in bad.stdout and "Traceback" not in bad.stderr


def test_translate_cli_on_the_artifact_matches_eager(demo_artifact, demo_model_dir):
    sentences = ["three hundred and forty-two", "seventy-one thousand and five"]
    onnx_run = twostep("translate", demo_artifact, *sentences, "--beam", "4")
    eager_run = twostep("translate", demo_model_dir, *sentences, "--beam", "4")
    assert onnx_run.returncode == 0 and eager_run.returncode == 0, onnx_run.stderr + eager_run.stderr
    assert onnx_run.stdout == eager_run.stdout and len(onnx_run.stdout.splitlines()) == 2


def test_inspect_prints_the_io_table(demo_artifact):
    result = twostep("inspect", demo_artifact)
    assert result.returncode == 0, result.stderr
    assert "past_key_self_0" in result.stdout and "past_len + new_len" in result.stdout


def test_failed_export_leaves_nothing_behind(tiny_ckpt, tmp_path, monkeypatch):
    monkeypatch.setitem(validate.TOLERANCES, "fp32", {"logits": (0.0, 0.0), "kv": (0.0, 0.0)})
    with pytest.raises(ParityFailure, match="parity failure"):
        export(tiny_ckpt, tmp_path / "out" / "art")
    # neither the artifact nor its temporary directory, nor the parent directory the export created
    assert sorted(p.name for p in tmp_path.iterdir()) == [tiny_ckpt.name]


@pytest.mark.slow
def test_base_preset_exports_and_validates(base_export):
    result = base_export
    assert result.report.ok and result.report.cases == 42
    assert load_artifact(result.path).config.d_model == 512


def test_int8_export_agrees_with_fp32_eager_and_a_broken_int8_path_fails(demo_int8, demo_model_dir, tmp_path):
    import shutil

    art = tmp_path / "int8"
    shutil.copytree(demo_int8, art)
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["precision"] == "int8" and manifest["quantization"]["reduce_range"] is True
    model = onnx.load(str(art / "decoder.onnx"))
    assert any(n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul") for n in model.graph.node)
    report = verify(art, demo_model_dir, "ort-cpu", beam_size=4)
    assert report.required_share == 0.99
    assert all(s.share >= 0.99 for s in report.sequences), [s.to_dict() for s in report.sequences]
    assert report.ok

    # Break the int8 path: scramble the quantized generator weights (and re-hash so the file loads).
    from twostep.artifact import sha256_file

    weight = max((t for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8),
                 key=lambda t: int(np.prod(t.dims)))
    array = onnx.numpy_helper.to_array(weight).copy()
    np.random.default_rng(0).shuffle(array.reshape(-1))
    weight.CopyFrom(onnx.numpy_helper.from_array(array, weight.name))
    onnx.save(model, str(art / "decoder.onnx"))
    manifest["files"]["decoder.onnx"] = sha256_file(art / "decoder.onnx")
    (art / "manifest.json").write_text(json.dumps(manifest))
    broken = verify(art, demo_model_dir, "ort-cpu", beam_size=2, limit=100)
    assert not broken.ok and broken.sequences[0].share < 0.99


def test_a_default_export_carries_the_in_place_decoder_that_ort_cpu_and_serve_decode_with(demo_inplace):
    """The fast path is the default: written wherever the model allows it, its shared weights stored once (as
    external data inside decoder.onnx, which stays what other runtimes read), chosen by ort-cpu, and a server
    batching in flight on it has nothing to warn about."""
    from twostep.artifact.spec import INPLACE
    from twostep.artifact.trust import external_data_locations
    from twostep.runtime.backends.ort import OrtBackend
    from twostep.serving.executor import BatchLimits, batching_advice

    art = load_artifact(demo_inplace.path)
    assert list(art.variants) == [INPLACE]
    assert external_data_locations(art.graph_file(INPLACE)) == {"decoder.onnx"}
    assert external_data_locations(art.graph_file("decoder")) == set()
    plain = sum(art.graph_file(g).stat().st_size for g in art.graphs)
    assert art.graph_file(INPLACE).stat().st_size < 0.15 * plain  # the packed projections, not a second decoder
    with OrtBackend(art) as backend:
        assert backend.decoder == INPLACE and batching_advice(backend, BatchLimits()) is None


def test_no_inplace_cache_writes_the_plain_graphs_only(tiny_ckpt, tmp_path):
    assert twostep("export", tiny_ckpt, "--out", tmp_path / "art", "--no-inplace-cache").returncode == 0
    assert load_artifact(tmp_path / "art").variants == {}
    assert not (tmp_path / "art" / "decoder_inplace.onnx").exists()
