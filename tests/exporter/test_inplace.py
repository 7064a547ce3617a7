"""Exporting the in-place decoder (twostep/exporter/inplace.py): a variant beside unchanged plain graphs, int8
too, and models the kernel cannot run refused with the reason."""

from __future__ import annotations

import torch

from cli_helpers import assert_user_error, twostep
from twostep.artifact import load_artifact
from twostep.artifact.spec import INPLACE, INPLACE_FILE, STANDARD_INPLACE, STANDARD_INPLACE_FILE
from twostep.model.checkpoint import save_checkpoint
from twostep.model.config import preset
from twostep.model.transformer import Transformer
from twostep.runtime.backends.inplace import InplaceSession
from twostep.runtime.backends.ort import OrtBackend


def test_export_adds_the_variant_beside_unchanged_plain_graphs(demo_inplace, demo_artifact):
    art = load_artifact(demo_inplace.path)
    plain = load_artifact(demo_artifact)
    assert art.graphs == plain.graphs  # the contract of TensorRT, C++ and other runtimes is untouched
    assert art.manifest.to_json()["graphs"] == plain.manifest.to_json()["graphs"]
    assert list(art.variants) == [INPLACE, STANDARD_INPLACE]
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


def test_the_standard_variant_is_plain_onnx_24_that_the_checker_accepts(demo_inplace):
    """decoder_inplace_standard: the same I/O as the contrib variant, in standard operators only (opset 24's
    TensorScatter and Attention for GroupQueryAttention), valid by onnx.checker's full check (with shapes);
    the contrib one passes it too."""
    import onnx

    art = load_artifact(demo_inplace.path)
    entry = art.manifest.to_json()["variants"][STANDARD_INPLACE]
    assert entry["file"] == STANDARD_INPLACE_FILE and entry["file"] in art.manifest.files
    assert (entry["runtime"], entry["ops"]) == ("opset 24", ["TensorScatter", "Attention"])
    assert art.variants[STANDARD_INPLACE].inputs == art.variants[INPLACE].inputs  # the same I/O and binding
    graph = onnx.load(art.graph_file(STANDARD_INPLACE), load_external_data=False)
    assert [(o.domain, o.version) for o in graph.opset_import] == [("", 24)]
    ops = {node.op_type for node in graph.graph.node}
    assert {"TensorScatter", "Attention"} <= ops and "GroupQueryAttention" not in ops
    for variant in (STANDARD_INPLACE, INPLACE):
        onnx.checker.check_model(str(art.graph_file(variant)), full_check=True)
    shown = twostep("inspect", demo_inplace.path)
    assert f"{STANDARD_INPLACE} ({STANDARD_INPLACE_FILE}; opset 24: TensorScatter, Attention)" in shown.stdout


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
