"""GPU paths that can be checked without a GPU: fp16 export, TensorRT compatibility of the graphs, and the
messages users get on a machine without CUDA or TensorRT."""

from __future__ import annotations

import json

import pytest

from cli_helpers import assert_user_error, twostep
from twostep.exporter.export import export
from twostep.exporter.trt_compat import check_trt_compatible
from twostep.runtime import backends
from twostep.verify import verify


@pytest.fixture(scope="module")
def demo_fp16(demo_model_dir, tmp_path_factory):
    return export(demo_model_dir, tmp_path_factory.mktemp("fp16") / "art", dtype="fp16",
                  also=["decoder_inplace_standard"]).path


def test_fp16_export_records_what_stayed_fp32(demo_fp16):
    m = json.loads((demo_fp16 / "manifest.json").read_text())
    assert m["precision"] == "fp16" and m["dtype"] == "float16"
    # ReduceSum: the search outputs' log-sum-exp
    assert set(m["quantization"]["kept_fp32_op_types"]) == {"LayerNormalization", "Softmax", "ReduceSum"}
    assert m["quantization"]["kept_fp32_nodes"] > 0
    dec = {t["name"]: t for t in m["graphs"]["decoder"]["inputs"]}
    assert dec["past_key_self_0"]["dtype"] == "float16"
    assert m["validation"]["tolerances"]["logits"] == [5e-2, 5e-2]
    # the standard in-place decoder, the GPU runtimes' (docs/gpu.md), validated step by step in fp16 too
    assert list(m["variants"]) == ["decoder_inplace_standard"]
    assert 0 < m["validation"]["max_error"]["decoder_inplace_standard.logits"] < 5e-2


def test_fp16_tokens_agree_with_fp32_eager(demo_fp16, demo_model_dir):
    # On ONNX Runtime's CPU provider here; on a GPU, scripts/gpu-check runs the same with ort-cuda and trt.
    report = verify(demo_fp16, demo_model_dir, "ort-cpu", beam_size=4, limit=300)
    assert report.required_share == 0.99 and report.ok, [s.to_dict() for s in report.sequences]


@pytest.mark.parametrize("variant", ["fp32", "fp16"])
def test_exported_graphs_are_tensorrt_compatible(variant, demo_artifact, demo_fp16, tiny_artifact):
    arts = [demo_artifact, tiny_artifact[0]] if variant == "fp32" else [demo_fp16]
    for art in arts:
        for graph in ("encoder.onnx", "decoder.onnx", "decoder_inplace_standard.onnx"):
            if (art / graph).exists():  # the standard in-place decoder: demo_fp16's
                assert check_trt_compatible(art / graph) == []
    assert (demo_fp16 / "decoder_inplace_standard.onnx").exists()


def test_the_standard_in_place_decoder_is_what_tensorrt_parses(demo_inplace, tmp_path):
    """decoder_inplace_standard passes the parser's published restrictions (TensorScatter on axis -2,
    Attention with a 4-D mask and one output); the contrib one and nonpad_kv_seqlen do not."""
    import onnx

    from twostep.artifact.spec import INPLACE_FILE, STANDARD_INPLACE_FILE

    assert check_trt_compatible(demo_inplace.path / STANDARD_INPLACE_FILE) == []
    assert any("com.microsoft" in p for p in check_trt_compatible(demo_inplace.path / INPLACE_FILE))
    model = onnx.load(demo_inplace.path / STANDARD_INPLACE_FILE, load_external_data=False)
    attention = next(n for n in model.graph.node if n.op_type == "Attention")
    attention.input.extend(["", "", "past_lengths"])  # per-row lengths as nonpad_kv_seqlen
    scatter = next(n for n in model.graph.node if n.op_type == "TensorScatter")
    next(a for a in scatter.attribute if a.name == "axis").i = 2
    onnx.save(model, tmp_path / "edited.onnx")
    problems = check_trt_compatible(tmp_path / "edited.onnx")
    assert any("no Attention input nonpad_kv_seqlen" in p for p in problems)
    assert any("axis -2 only" in p for p in problems)


def test_tensorrt_check_catches_what_tensorrt_refuses(demo_int8, demo_artifact, tmp_path):
    import shutil

    from twostep.exporter.quantize import fuse_transformer_ops

    problems = check_trt_compatible(demo_int8 / "decoder.onnx")
    assert any("DynamicQuantizeLinear" in p and "not supported" in p for p in problems)
    assert any("MatMulInteger" in p for p in problems)
    fused = tmp_path / "encoder.onnx"
    shutil.copyfile(demo_artifact / "encoder.onnx", fused)
    assert fuse_transformer_ops(fused, n_heads=4, d_model=128) == {"SkipLayerNormalization": 7}
    assert any("com.microsoft" in p for p in check_trt_compatible(fused))


def test_every_family_config_exports_tensorrt_compatible_graphs(tmp_path):
    import torch

    from twostep.model.checkpoint import save_checkpoint
    from twostep.model.config import FAMILIES, family_config, preset
    from twostep.model.transformer import Transformer

    for family in ("annotated-a2b2", "jadore"):
        assert family in FAMILIES
        torch.manual_seed(0)
        config = family_config(family, preset("tiny", 40, 40, dropout=0.0))
        ckpt = save_checkpoint(Transformer(config), tmp_path / family)
        art = export(ckpt, tmp_path / f"{family}-art").path
        for graph in ("encoder.onnx", "decoder.onnx"):
            assert check_trt_compatible(art / graph) == [], family


def test_bench_trt_without_tensorrt_is_one_line(demo_artifact):
    if backends.unavailable_reason("trt") is None:
        pytest.skip("TensorRT is available on this machine")
    result = twostep("bench", demo_artifact, "--backend", "trt")
    assert_user_error(result, "backend 'trt' is not available here", "TensorRT", "pip install 'twostep[trt]'")
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1


def test_build_engine_without_tensorrt(demo_artifact):
    if backends.unavailable_reason("trt") is None:
        pytest.skip("TensorRT is available on this machine")
    assert_user_error(twostep("build-engine", demo_artifact), "TensorRT is not available here")


def test_torch_cuda_without_gpu_is_a_user_error(demo_model_dir):
    if backends.unavailable_reason("torch", device="cuda") is None:
        pytest.skip("a CUDA GPU is visible")
    assert_user_error(twostep("translate", demo_model_dir, "one", "--device", "cuda"), "use --device cpu")


@pytest.mark.trt
def test_trt_engines_are_cached_and_match_eager(demo_artifact, demo_model_dir):
    reason = backends.unavailable_reason("trt")
    if reason:
        pytest.skip(f"trt unavailable here: {reason}")
    report = verify(demo_artifact, demo_model_dir, "trt", beam_size=4, device="cuda")
    assert report.ok, [s.to_dict() for s in report.sequences]
    engines = sorted((demo_artifact / "engines").glob("*.plan"))
    assert len(engines) == 2
    stamps = [p.stat().st_mtime for p in engines]
    verify(demo_artifact, demo_model_dir, "trt", beam_size=2, limit=20, device="cuda")
    assert [p.stat().st_mtime for p in sorted((demo_artifact / "engines").glob("*.plan"))] == stamps
