"""`twostep bench`: every requested backend is measured or reported unavailable; numbers are plausible.
(Speed itself is measured by benchmarks, never asserted in tests.)"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cli_helpers import assert_user_error, twostep
from twostep.artifact import load_artifact
from twostep.artifact.spec import INPLACE
from twostep.bench import Product, Workload, gemm_floor, gemm_products, make_sources


def test_bench_reports_every_backend(tiny_artifact):
    art, ckpt = tiny_artifact
    result = twostep("bench", art, "--backend", "ort-cpu,torch,ort-cuda", "--checkpoint", ckpt, "--batch", "1,3",
                     "--src-len", "5", "--new-tokens", "4", "--warmup", "1", "--iters", "2", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [(r["backend"], r["workload"]["batch"]) for r in rows] == [
        ("ort-cpu", 1), ("ort-cpu", 3), ("torch", 1), ("torch", 3), ("ort-cuda", 1), ("ort-cuda", 3)]
    for r in rows[:4]:
        assert r["error"] is None and r["iters"] == 2
        assert r["tokens_per_s"] > 0 and r["ms_per_step"] >= 0 and r["encoder_ms"] > 0 and r["peak_rss_mb"] > 10
        assert r["latency_ms"]["p50"] <= r["latency_ms"]["p95"] <= r["latency_ms"]["p99"]
    cuda = rows[4]
    if cuda["error"] is not None:  # no GPU here: reported, not dropped
        assert "not available here" in cuda["error"]
    batched = rows[1]  # ort-cpu at 3 rows: its step against the GEMM floor of its decoder at 3 rows
    assert batched["gemm_floor_ms"] > 0
    assert batched["step_vs_gemm_floor"] == pytest.approx(batched["ms_per_step"] / batched["gemm_floor_ms"])
    flops = 2 * 3 * sum(p.k * p.n * p.count for p in gemm_products(art / "decoder.onnx"))
    assert batched["gemm_gflops"] == pytest.approx(flops / batched["gemm_floor_ms"] / 1e6)
    for r in [rows[0], *rows[2:]]:  # batch 1 (bound by reading the weights), and not ort-cpu: no GEMM floor
        assert r["gemm_floor_ms"] is None and r["gemm_gflops"] is None and r["step_vs_gemm_floor"] is None


def test_bench_table_and_ratio(tiny_artifact):
    art, ckpt = tiny_artifact
    result = twostep("bench", art, "--backend", "ort-cpu,torch", "--checkpoint", ckpt, "--batch", "2",
                     "--src-len", "4", "--new-tokens", "3", "--warmup", "0", "--iters", "1")
    assert result.returncode == 0, result.stderr
    assert "1.00x" in result.stdout and "torch" in result.stdout and "tokens/s" in result.stdout
    assert "GEMM floor ms" in result.stdout and "GEMM floor: ONNX Runtime's time" in result.stdout  # batch 2: ort-cpu's


def test_torch_without_checkpoint_is_reported(tiny_artifact):
    result = twostep("bench", tiny_artifact[0], "--backend", "torch", "--batch", "1", "--new-tokens", "2",
                     "--iters", "1", "--warmup", "0", "--json")
    assert result.returncode == 0, result.stderr
    assert "needs the checkpoint" in json.loads(result.stdout)[0]["error"]


def test_bad_bench_flags(tiny_artifact):
    assert_user_error(twostep("bench", tiny_artifact[0], "--batch", "1,x"), "--batch takes comma-separated integers")
    assert_user_error(twostep("bench", tiny_artifact[0], "--new-tokens", "1000"), "at most max_positions 64")


def test_same_sources_for_every_backend():
    a = make_sources(100, 3, 4, 8)
    assert a == make_sources(100, 3, 4, 8) and len(a) == 4
    assert all(len(s) == 8 and s[-1] == 3 and min(s[:-1]) >= 4 for s in a)
    assert Workload(32).label == "batch 32, src 32, 64 new"


def test_bench_runs_both_decoders_side_by_side_and_refuses_a_bad_suffix(demo_inplace):
    proc = twostep("bench", demo_inplace.path, "--backend", "ort-cpu:inplace,ort-cpu:concat", "--batch", "2",
               "--new-tokens", "40", "--warmup", "0", "--iters", "1", "--beam", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["backend"] for r in rows] == ["ort-cpu:inplace", "ort-cpu:concat"]
    assert all(r["error"] is None and r["tokens_per_s"] > 0 for r in rows)
    assert [r["decoder"] for r in rows] == ["decoder_inplace", "decoder"]  # what each backend chose, reported
    assert_user_error(twostep("bench", demo_inplace.path, "--backend", "ort-cuda:inplace"),
                      "only ort-cpu takes a decoder suffix")


def found(graph_file) -> dict:
    products = gemm_products(graph_file)
    by_shape = {(p.k, p.n, p.int8): p.count for p in products}
    assert len(by_shape) == len(products)  # one Product per distinct shape
    return by_shape


def expected(config, inplace: bool, int8: bool) -> dict:
    """Per decoder layer: self-attention's q, k, v (one (d, 3d) product in the in-place decoder) and out,
    cross-attention's q and out (the encoder computes its K and V), the feed-forward's two; then the generator,
    a Gemm over 2-D rows that reads a tied embedding table (the demo's) as it is (transB), so int8 export
    quantizes it too (through a Transpose of the table, it stayed fp32)."""
    d, layers = config.d_model, config.n_decoder_layers
    shapes = Counter({(d, 3 * d, int8): layers} if inplace else {(d, d, int8): 3 * layers})
    shapes.update({(d, d, int8): 3 * layers, (d, config.d_ff, int8): layers, (config.d_ff, d, int8): layers})
    shapes[d, config.tgt_vocab_size, int8] += 1
    return dict(shapes)


def test_gemm_products_of_the_plain_in_place_and_int8_decoders(tiny_artifact, demo_inplace, demo_int8):
    tiny = load_artifact(tiny_artifact[0])
    assert found(tiny.graph_file("decoder")) == expected(tiny.config, inplace=False, int8=False)
    for path, int8 in ((demo_inplace.path, False), (demo_int8, True)):
        art = load_artifact(path)
        assert art.config.tie_generator and not tiny.config.tie_generator  # both kinds of generator
        assert found(art.graph_file("decoder")) == expected(art.config, inplace=False, int8=int8)
        assert found(art.graph_file(INPLACE)) == expected(art.config, inplace=True, int8=int8)


def test_gemm_products_of_an_int4_decoder(demo_int4, demo_inplace):
    """Every product of an int4 decoder is a MatMulNBits, of the fp32 decoder's shapes; `twostep bench` times
    them for its GEMM floor."""
    for graph in ("decoder", INPLACE):
        fp32 = gemm_products(load_artifact(demo_inplace.path).graph_file(graph))
        int4 = gemm_products(load_artifact(demo_int4).graph_file(graph))
        assert all(p.int4 and not p.int8 for p in int4)
        assert sorted((p.k, p.n, p.count) for p in int4) == sorted((p.k, p.n, p.count) for p in fp32)
    proc = twostep("bench", demo_int4, "--batch", "2", "--new-tokens", "8", "--warmup", "0", "--iters", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [r["gemm_floor_ms"] > 0 for r in json.loads(proc.stdout)] == [True]


def test_gemm_products_reach_weights_through_transpose_cast_and_dequantize(tmp_path):
    """A tied generator (Transpose of the embedding table), Gemm's transB, fp16 weights behind a Cast, QDQ
    weights and int8 products are found; a product of two activations is not."""
    init = [numpy_helper.from_array(np.zeros(shape, dtype), name) for name, shape, dtype in (
        ("embed", (12, 8), np.float32), ("g", (16, 8), np.float32), ("h", (8, 4), np.float16),
        ("w", (8, 3), np.float32), ("q", (8, 6), np.int8), ("dq", (8, 5), np.int8), ("scale", (), np.float32))]
    nodes = [helper.make_node("Transpose", ["embed"], ["embed_t"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "embed_t"], ["logits"]),
             helper.make_node("Gemm", ["x", "g"], ["gemm"], transB=1),
             helper.make_node("Cast", ["h"], ["h32"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["x", "h32"], ["half"]),
             helper.make_node("MatMul", ["x", "w"], ["w1"]), helper.make_node("MatMul", ["x", "w"], ["w2"]),
             helper.make_node("MatMulInteger", ["xq", "q"], ["int"]),
             helper.make_node("DequantizeLinear", ["dq", "scale"], ["dq32"]),
             helper.make_node("MatMul", ["x", "dq32"], ["qdq"]),
             helper.make_node("Transpose", ["x"], ["x_t"]), helper.make_node("MatMul", ["x", "x_t"], ["scores"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
              helper.make_tensor_value_info("xq", TensorProto.UINT8, [2, 8])]
    outputs = [helper.make_tensor_value_info(n.output[0], TensorProto.UNDEFINED, None) for n in nodes]
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, init)), tmp_path / "g.onnx")
    assert found(tmp_path / "g.onnx") == {(8, 12, False): 1, (8, 16, False): 1, (8, 4, False): 1, (8, 3, False): 2,
                                          (8, 6, True): 1, (8, 5, False): 1}


def test_gemm_floor_sums_each_product_times_its_count():
    products = [Product(8, 16, count=3), Product(16, 8, count=2, int8=True), Product(32, 8, int4=True)]
    floor = gemm_floor(products, rows=4, threads=1, repeats=3, warmup=1)
    assert [p for p, _ in floor.timed] == products and all(ms > 0 for _, ms in floor.timed)
    assert floor.ms == pytest.approx(3 * floor.timed[0][1] + 2 * floor.timed[1][1] + floor.timed[2][1])
    assert floor.flops == 2 * 4 * (8 * 16 * 3 + 16 * 8 * 2 + 32 * 8)
    assert floor.gflops == pytest.approx(floor.flops / floor.ms / 1e6)
    assert "8x16 fp32 x3" in floor.rates() and "16x8 int8 x2" in floor.rates() and "32x8 int4 x1" in floor.rates()


@pytest.mark.parametrize("args", [["--beam", "2"], ["--beam", "2", "--search", "logits"], ["--beam", "1"],
                                  ["--beam", "2", "--loop", "reference", "--kv-cache", "concat"]])
def test_beam_profile_runs_on_a_tiny_artifact(demo_inplace, capsys, args):
    """benchmarks/beam_profile.py, seconds long, so that it cannot rot."""
    from benchmarks import beam_profile

    assert beam_profile.main([str(demo_inplace.path), "--batch", "2", "--new-tokens", "3", "--ops", "2", *args]) == 0
    out = capsys.readouterr().out
    graph = "--search" not in args and "reference" not in args
    assert ("on the search outputs" if graph else "on the full logits") in out
    assert "ms/step" in out and "| all kernels |" in out


def test_beam_profile_times_the_attention_variants(demo_inplace, capsys):
    """beam_profile --attention: every variant checked against numpy (a wrong one raises) and found to write
    its cache in place, on a few rows, seconds long."""
    from benchmarks import attention, beam_profile

    args = [str(demo_inplace.path), "--attention", "--rows", "8", "--pasts", "3", "--beam", "2", "--iters", "2"]
    assert beam_profile.main(args) == 0
    out = capsys.readouterr().out
    assert "4 heads of 32" in out and out.count("| yes |") == len(attention.VARIANTS)
    assert "| 8 | 3 | 32 |" in out  # rows, past, the in-place session's capacity for it
    assert "| 8 | 32 |" in out  # capacity 8x the valid length


def test_the_attention_reference_sees_a_wrong_variant():
    """The numpy reference the variants are checked against: a row that attends past its length differs."""
    import numpy as np

    from benchmarks.attention import reference

    g = np.random.default_rng(0)
    q, k, v = (g.standard_normal((2, 1, 8), dtype=np.float32) for _ in range(3))
    cache = [g.standard_normal((2, 2, 6, 4), dtype=np.float32) for _ in range(2)]
    right = reference(q, k, v, *cache, np.array([3, 5]))
    assert not np.allclose(right, reference(q, k, v, *cache, np.array([4, 5])))


def test_a_noisy_encoder_run_never_gives_a_negative_step_time():
    """The encoder is timed apart and taken off the request's median; a run where the encoder alone took longer
    (a loaded machine) leaves the step at zero, never below it. CI once reported -20.9 ms a step."""
    import time

    from twostep.bench import measure

    w = Workload(batch=1, src_len=4, new_tokens=4)
    slow_encoder = measure("x", w, request=lambda: time.sleep(0.002), encode=lambda: time.sleep(0.02),
                           warmup=0, iters=3)
    assert slow_encoder.ms_per_step == 0 and slow_encoder.encoder_ms >= 2
    usual = measure("x", w, request=lambda: time.sleep(0.02), encode=lambda: time.sleep(0.002), warmup=0, iters=3)
    assert usual.ms_per_step == pytest.approx((usual.latency_ms["p50"] - usual.encoder_ms) / 4)
    assert usual.ms_per_step > 3
