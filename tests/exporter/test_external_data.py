"""A model past protobuf's 2 GB, forced at the demo's size: with shared.EXTERNAL_DATA_BYTES lowered to 0 every
graph keeps its weights in one external data file (twostep.exporter.shared.store_once), each tensor once
(the demo_external fixture; tests/cpp/test_cpp.py holds the C++ library to it). Until then a step that rewrites
one graph past the threshold saves it with its own `<name>.data` (shared.save_graph)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from safetensors.torch import load_file

from twostep.artifact import load_artifact
from twostep.artifact.trust import external_data_locations
from twostep.errors import BadArtifact
from twostep.exporter import shared
from twostep.exporter.export import export
from twostep.runtime.translator import open_translator

SENTENCES = ["three hundred and forty-two", "nineteen thousand, eight hundred and seven", "six hundred and one"]


def parameter_bytes(model_dir) -> int:
    """The checkpoint's tensors, each once (ties are one tensor in safetensors)."""
    tensors = load_file(str(model_dir / "model.safetensors"))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def translations(art) -> list[list[int]]:
    translator, backend = open_translator(art, "ort-cpu")
    with backend:
        return translator.translate(SENTENCES)


def test_every_graph_reads_its_weights_from_the_one_data_file(demo_external):
    art = load_artifact(demo_external)
    assert set(art.graphs) | set(art.variants) == {"encoder", "decoder", "decoder_inplace"}
    for name in [*art.graphs, *art.variants]:
        assert external_data_locations(art.graph_file(name)) == {shared.WEIGHTS}
    assert not [p.name for p in demo_external.iterdir() if p.suffix == ".data" and p.name != shared.WEIGHTS]


def test_it_decodes_the_same_tokens_as_the_inline_export(demo_external, demo_inplace):
    assert not any(p.suffix == ".data" for p in demo_inplace.path.iterdir())
    assert translations(demo_external) == translations(demo_inplace.path)


def test_each_weight_is_stored_once(demo_external, demo_model_dir):
    """The data file holds the parameters once (the tied tables too) and the in-place decoder's packed QKV; the
    graph files only tensors under SMALLEST bytes besides the structure (at the demo's size the structure is a
    tenth of the weights, at NLLB-600M's a thousandth: not counted here)."""
    assert (demo_external / shared.WEIGHTS).stat().st_size <= 1.2 * parameter_bytes(demo_model_dir)
    for graph in demo_external.glob("*.onnx"):
        model = onnx.load(str(graph), load_external_data=False)
        assert max(len(t.raw_data) for t in model.graph.initializer) < shared.SMALLEST


def test_the_manifest_hashes_the_data_file_and_a_tampered_one_is_refused(demo_external, tmp_path):
    manifest = json.loads((demo_external / "manifest.json").read_text())
    assert shared.WEIGHTS in manifest["files"]
    art = tmp_path / "art"
    shutil.copytree(demo_external, art)
    data = bytearray((art / shared.WEIGHTS).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (art / shared.WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(BadArtifact, match="sha256 does not match"):
        load_artifact(art)
    manifest["files"].pop(shared.WEIGHTS)
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BadArtifact, match="not listed"):
        load_artifact(art)


def test_int8_exports_on_the_external_data_path(demo_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(shared, "EXTERNAL_DATA_BYTES", 0)
    result = export(demo_model_dir, tmp_path / "art", dtype="int8")
    art = load_artifact(result.path)
    assert result.report.ok and art.precision == "int8"
    for name in [*art.graphs, *art.variants]:
        assert external_data_locations(art.graph_file(name)) == {shared.WEIGHTS}
    assert (result.path / shared.WEIGHTS).stat().st_size <= 0.6 * parameter_bytes(demo_model_dir)


def affine_graph() -> onnx.ModelProto:
    """y = x @ w + b: w of 16 KiB, b of 256 bytes (under SMALLEST: it stays in the graph file)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])]
    graph = helper.make_graph(nodes, "affine", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_save_graph_writes_its_data_file_past_the_threshold_and_inline_below(tmp_path, monkeypatch):
    """Each save replaces the graph and the data files it used: a file of another name (as torch.onnx.export
    writes), its own `<name>.data` (rewritten, not appended to), and no data file once it is inline."""
    model = affine_graph()
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    path = tmp_path / "affine.onnx"
    onnx.save(onnx.load_from_string(model.SerializeToString()), str(path), save_as_external_data=True,
              location="exported.bin")
    monkeypatch.setattr(shared, "EXTERNAL_DATA_BYTES", shared.tensor_bytes(model) - 1)
    for _ in range(2):
        shared.save_graph(onnx.load(str(path)), path)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["affine.onnx", "affine.onnx.data"]
        assert external_data_locations(path) == {"affine.onnx.data"}
        assert (tmp_path / "affine.onnx.data").stat().st_size == 64 * 64 * 4  # b, under SMALLEST, stayed inline
        onnx.checker.check_model(str(path))
        assert np.array_equal(ort.InferenceSession(str(path)).run(None, {"x": x})[0], want)
    monkeypatch.setattr(shared, "EXTERNAL_DATA_BYTES", shared.tensor_bytes(model))  # not past it: inline
    shared.save_graph(onnx.load(str(path)), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["affine.onnx"]
    assert np.array_equal(ort.InferenceSession(str(path)).run(None, {"x": x})[0], want)


def test_storing_removes_each_graphs_data_once_no_graph_still_to_be_stored_reads_it(tmp_path, monkeypatch):
    """store_once copies graph after graph into WEIGHTS; a graph's own data file goes as soon as it is stored, not
    after the last graph: the disk never holds every graph's file and all of WEIGHTS at once. A file that a later
    graph reads too stays until that graph is stored."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.external_data_helper import convert_model_to_external_data

    rng = np.random.default_rng(0)
    common = rng.standard_normal((64, 64)).astype(np.float32)
    for stem in ("a", "b", "c"):
        weights = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w"),
                   numpy_helper.from_array(common, "common")]
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]),
                                   helper.make_node("MatMul", ["h", "common"], ["y"])], stem,
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], weights)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        convert_model_to_external_data(model, location=f"{stem}.data", size_threshold=0)
        onnx.save(model, str(tmp_path / f"{stem}.onnx"))
    a = onnx.load(str(tmp_path / "a.onnx"), load_external_data=False)
    b = onnx.load(str(tmp_path / "b.onnx"), load_external_data=False)
    b.graph.initializer[1].ClearField("external_data")  # b reads its "common" from a's file
    b.graph.initializer[1].external_data.extend(a.graph.initializer[1].external_data)
    onnx.save(b, str(tmp_path / "b.onnx"))
    present = []
    copy = shared.copy_span

    def watching(source, offset, length, out, digest):
        data = sorted(p.name for p in tmp_path.glob("*.data") if p.name != shared.WEIGHTS)
        present.append((Path(source.name).name, data))
        return copy(source, offset, length, out, digest)

    monkeypatch.setattr(shared, "copy_span", watching)
    shared.store_once([tmp_path / f"{stem}.onnx" for stem in ("a", "b", "c")])
    assert present == [("a.data", ["a.data", "b.data", "c.data"])] * 2 + [("b.data", ["a.data", "b.data", "c.data"]),
                                                                          ("a.data", ["a.data", "b.data", "c.data"])] \
        + [("c.data", ["c.data"])] * 2, present
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([shared.WEIGHTS, "a.onnx", "b.onnx", "c.onnx"])
    x = rng.standard_normal((1, 64)).astype(np.float32)
    for stem in ("a", "b", "c"):
        assert ort.InferenceSession(str(tmp_path / f"{stem}.onnx")).run(None, {"x": x})[0].shape == (1, 64)
