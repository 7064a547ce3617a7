"""int8 export (twostep/exporter/quantize.py): it agrees with fp32 eager PyTorch, and a broken int8 path fails."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

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
    fp32 table left only to the embedding's Gather (the trace's fold_weight_transposes,
    twostep/exporter/graphs.py)."""
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


def whole_graph_int8(graph, out):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from twostep.exporter.quantize import QUANTIZATION as q

    quantize_dynamic(graph, out, op_types_to_quantize=q["op_types"], weight_type=QuantType.QInt8,
                     per_channel=q["per_channel"], reduce_range=q["reduce_range"],
                     extra_options={"MatMulConstBOnly": q["matmul_const_b_only"]})


def whole_graph_int4(graph, out):
    from twostep.exporter.int4 import QUANTIZATION as q
    from twostep.exporter.int4 import nbits_quantizer

    quantizer = nbits_quantizer()(onnx.load(str(graph)), bits=q["bits"], block_size=q["block_size"],
                                  is_symmetric=q["symmetric"], accuracy_level=q["accuracy_level"],
                                  op_types_to_quantize=("MatMul",))
    quantizer.process()
    onnx.save(quantizer.model.model, str(out))


@pytest.mark.parametrize("chunk", [64 << 20, 4096])
@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_weight_by_weight_quantization_computes_what_the_whole_graph_quantizer_computes(demo_artifact, tmp_path,
                                                                                        dtype, chunk, monkeypatch):
    """quantize_int8 and quantize_int4 quantize one weight at a time (and, past QUANTIZE_CHUNK bytes, a few
    columns at a time); the graph each writes gives, bit for bit, the outputs of ONNX Runtime's quantizer run on
    the whole graph with the same settings (quantize_dynamic; MatMulNBitsQuantizer)."""
    import shutil

    import onnxruntime as ort

    from twostep.exporter import quantize
    from twostep.exporter.int4 import quantize_int4

    monkeypatch.setattr(quantize, "QUANTIZE_CHUNK", chunk)
    ours_of, whole, op = {"int8": (quantize.quantize_int8, whole_graph_int8, "MatMulInteger"),
                          "int4": (quantize_int4, whole_graph_int4, "MatMulNBits")}[dtype]
    for graph in ("encoder", "decoder"):
        ours, theirs = tmp_path / f"{graph}.onnx", tmp_path / f"{graph}.whole.onnx"
        shutil.copyfile(demo_artifact / f"{graph}.onnx", ours)
        whole(ours, theirs)
        ours_of(ours)
        assert sum(n.op_type == op for n in onnx.load(str(ours)).graph.node) == \
            sum(n.op_type == op for n in onnx.load(str(theirs)).graph.node) > 0
        sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (ours, theirs)]
        rng = np.random.default_rng(0)
        feeds = {}
        for value in sessions[1].get_inputs():
            shape = [d if isinstance(d, int) else {"batch": 2}.get(d, 3) for d in value.shape]
            if value.type == "tensor(int64)":
                feeds[value.name] = (np.full(shape, 3, np.int64) if "length" in value.name
                                     else rng.integers(4, 30, shape, dtype=np.int64))
                if "mask" in value.name:
                    feeds[value.name] = np.ones(shape, np.int64)
            else:
                feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
        got, want = (s.run(None, feeds) for s in sessions)
        for a, b in zip(got, want):
            assert np.array_equal(a, b)
