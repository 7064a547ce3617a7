"""int8 export (twostep/exporter/quantize.py): it agrees with fp32 eager PyTorch, and a broken int8 path fails."""

from __future__ import annotations

import json

import numpy as np
import onnx

from twostep.verify import verify


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


def test_int8_export_quantizes_the_tied_generator(demo_int8):
    """The demo model's generator is its target embedding (tied): the step's largest product must be int8 too, its
    fp32 table left only to the embedding's Gather (twostep/exporter/quantize.py's transpose_constant_weights)."""
    manifest = json.loads((demo_int8 / "manifest.json").read_text())
    config = manifest["model"]
    assert config["tie_generator"], "the test needs a model whose generator is tied to its embedding"
    table = sorted((config["d_model"], config["tgt_vocab_size"]))
    model = onnx.load(str(demo_int8 / "decoder.onnx"))
    integer = [t for t in model.graph.initializer if t.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)]
    assert any(sorted(t.dims) == table for t in integer), "the generator's weight is not quantized"
    fp32 = {t.name for t in model.graph.initializer
            if t.data_type == onnx.TensorProto.FLOAT and sorted(t.dims) == table}
    readers = {n.op_type for n in model.graph.node if fp32 & set(n.input)}
    assert readers <= {"Gather"}, f"an fp32 {table} table is read by {readers}"
