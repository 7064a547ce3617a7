"""benchmarks/t5.py on its tiny mT5 model (--smoke): every installed engine runs every workload and generates exactly
the asked-for tokens; CTranslate2 fp32 (converted with the benchmark's fix of its output scale) and twostep fp32
reproduce eager transformers, greedy and beam; the tables carry the weight-read floor and the export times. Optimum
runs from its own venv (benchmarks/t5.py makes it): its test is skipped where that venv is absent, as on CI, and
nothing is installed here (--no-install). (Speed itself is measured by the benchmark, never asserted in tests.)"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the T5 benchmark builds its model with transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package
from benchmarks import t5  # noqa: E402

pytestmark = pytest.mark.slow

NEW_TOKENS = 8  # --smoke's
WORKLOADS = ["greedy-b1", "greedy", "beam"]
SENTENCES = {"greedy-b1": 2, "greedy": 4, "beam": 4}


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def twostep_imports_mt5() -> bool:
    from twostep.model.hf import FAMILIES

    return "mt5" in FAMILIES


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("t5")  # shared: the model, its conversions and the reference are built once


def run(work: Path, engines: list[str], *extra: str) -> dict:
    out = work / f"{'-'.join(engines)}.json"
    assert t5.main(["--smoke", "--work", str(work), "--engines", ",".join(engines), "--json", str(out), "--markdown",
                    str(work / f"{'-'.join(engines)}.md"), "--no-install", *extra]) == 0
    return json.loads(out.read_text())


def check_rows(result: dict, engines: list[str]) -> dict:
    assert result["errors"] == {}
    rows = {(r["engine"], r["key"]): r for r in result["rows"]}
    assert set(rows) == {(e, w) for e in engines for w in WORKLOADS}
    for (e, w), r in rows.items():
        assert r["sentences"] == SENTENCES[w] and len(r["batch_s"]) == r["batches"]
        assert r["all_lengths_equal_new_tokens"] and r["tokens"] == r["sentences"] * NEW_TOKENS, (e, w)
        assert 0 < r["min_batch_ms"] <= r["median_batch_ms"] <= r["max_batch_ms"] and r["tokens_per_s"] > 0
    floors = {f["engine"]: f for f in result["floor"]}
    assert set(floors) == set(engines)
    for f in floors.values():
        assert f["floor_ms"] > 0 and f["ms_per_token"] > 0 and f["times_floor"] > 0
    assert result["meta"]["bandwidth"]["bytes_per_s"] > 0
    return rows


def test_every_installed_engine(work):
    """twostep and CTranslate2, fp32 and int8, in one run (as the benchmark compares them): each generates the
    asked-for tokens; twostep fp32 and CTranslate2 fp32 (the converted model computes transformers' logits)
    decode what eager transformers does, greedy and beam."""
    engines = (["twostep-fp32", "twostep-int8"] if twostep_imports_mt5() else []) + \
        (["ct2-fp32", "ct2-int8"] if installed("ctranslate2") else [])
    if not engines:
        pytest.skip("neither twostep imports mT5 nor is ctranslate2 installed (pip install -e '.[bench]')")
    result = run(work, engines)
    rows = check_rows(result, engines)
    exact = [e for e in ("twostep-fp32", "ct2-fp32") if e in engines]
    for e in exact:
        for w in WORKLOADS:
            assert rows[e, w]["same_as_eager"] == rows[e, w]["sentences"], (e, w)
    meta, steps = result["meta"], {x["step"] for x in result["exports"]}
    if "ct2-fp32" in engines:
        assert meta["engines"]["ct2-fp32"]["compute_type"] == "float32"
        assert meta["engines"]["ct2-int8"]["compute_type"].startswith("int8")
        assert steps >= {"ct2-fp32", "ct2-int8"}
        assert "Weight-read floor at batch 1" in (work / f"{'-'.join(engines)}.md").read_text()
    if "twostep-fp32" in engines:
        assert meta["engines"]["twostep-fp32"]["backend"].startswith("ort-cpu")
        assert steps >= {"twostep-import", "twostep-fp32", "twostep-int8"}
    pairs = {(s["twostep"], s["other"], s["key"]) for s in result["speedups"]}
    assert pairs == ({(a, b, w) for a, b in (("twostep-fp32", "ct2-fp32"), ("twostep-int8", "ct2-int8"))
                      for w in WORKLOADS} if len(engines) == 4 else set())
    assert result["export_ratio"] is None  # no Optimum in this run


def test_optimum(work):
    if not t5.optimum_installed(t5.DEFAULT_OPTIMUM_VENV):
        pytest.skip(f"no Optimum venv at {t5.DEFAULT_OPTIMUM_VENV} (optimum-onnx needs transformers < 4.58; "
                    "`python -m benchmarks.t5` makes that venv)")
    engines = ["optimum"] + (["twostep-fp32"] if twostep_imports_mt5() else [])
    result = run(work, engines)
    rows = check_rows(result, engines)
    for w in WORKLOADS:
        assert rows["optimum", w]["same_as_eager"] == rows["optimum", w]["sentences"], w
    info = result["meta"]["engines"]["optimum"]
    assert info["optimum-onnx"] == t5.OPTIMUM_VERSIONS["optimum-onnx"]
    assert info["decoder"] == "decoder + decoder_with_past"
    assert "optimum" in {x["step"] for x in result["exports"]}
    if "twostep-fp32" in engines:
        assert result["export_ratio"]["ratio"] > 0 and result["export_ratio"]["target"] == t5.EXPORT_TARGET


def test_a_missing_optimum_venv_is_reported_not_installed(work):
    venv = work / "no-such-venv"
    result = run(work, ["optimum"], "--optimum-venv", str(venv))
    assert "--no-install" in result["errors"]["optimum"] and result["rows"] == []
    assert not venv.exists()


def test_model_layout(tmp_path):
    """mT5's layout: tie_word_embeddings false in config.json and a head of its own; a tokenizer of 300 ids (pieces
    and 100 extra ids) below the embedding's 312 rows, <pad> </s> <unk> first, <extra_id_0> last."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    size = t5.SMOKE
    hf = t5.build_hf_model(tmp_path / "hf", size)
    config = json.loads((hf / "config.json").read_text())
    assert config["model_type"] == "mt5" and config["tie_word_embeddings"] is False
    assert AutoConfig.from_pretrained(hf).vocab_size == size.rows
    with safe_open(str(hf / "model.safetensors"), "pt") as f:
        assert not f.get_tensor("lm_head.weight").equal(f.get_tensor("shared.weight"))
    tokenizer = AutoTokenizer.from_pretrained(hf)
    assert len(tokenizer) == size.tokenizer_ids == 300
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 299]) == ["<pad>", "</s>", "<unk>", "<extra_id_0>"]
    sources = t5.make_sentences(4, size)
    assert all(s[-1] == t5.EOS and all(3 <= i < size.pieces for i in s[:-1]) for s in sources)
    assert t5.canonical([[5, 300, 311]], size) == [[5, 299, 288]]


def test_step_weight_bytes():
    """mT5-base's decoder step: 12 layers of 8,257,536 weights (self-attention 4 x 768 x 768, cross-attention's q
    and o, the gated FFN 3 x 768 x 2048) and the lm_head's 250,112 x 768."""
    fp32, int8 = t5.step_weight_bytes(t5.BASE, "fp32"), t5.step_weight_bytes(t5.BASE, "int8")
    assert fp32["weights"]["lm_head"] == 192_086_016
    matrices = 12 * 8_257_536 + 192_086_016
    assert fp32["bytes"] == 4 * (matrices + 37 * 768)
    assert matrices < int8["bytes"] < matrices * 1.01
