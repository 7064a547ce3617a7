"""Export and verify on the demo model: whole decoded sequences identical to eager PyTorch (twostep/verify.py)."""

from __future__ import annotations

import json

import numpy as np
import onnx

from cli_helpers import twostep
from twostep.exporter.validate import FULL_GRID
from twostep.verify import verify


def test_ort_cpu_greedy_and_beam4_identical_on_the_whole_test_split(demo_artifact, demo_model_dir):
    report = verify(demo_artifact, demo_model_dir, "ort-cpu", beam_size=4)
    assert report.graphs.ok, report.graphs.failures[:3]
    grid = FULL_GRID  # verify checks the full grid, export a part of it
    assert report.graphs.cases == len(grid.batch) * len(grid.src_len) * (1 + len(grid.past_len) * len(grid.new_len))
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
