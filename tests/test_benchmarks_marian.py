"""benchmarks/marian.py on a tiny Marian model and (`--family nllb`) a tiny NLLB model: every installed engine
runs every workload, generates exactly the asked-for tokens (after NLLB's forced target language code) and never
the pad id; twostep fp32 reproduces eager transformers. (Speed itself is measured by the benchmark, never asserted
in tests.)"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the Marian benchmark builds its model with transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package
from benchmarks import marian  # noqa: E402

pytestmark = pytest.mark.slow

NEW_TOKENS = 8  # --tiny's
WORKLOADS = ["greedy batch 1", "greedy batch 32", "beam 4 batch 32"]
NLLB_WORKLOADS = ["greedy batch 1", "greedy batch 16", "beam 4 batch 8"]


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("marian")  # shared: the model and its conversions are built once


def run(work, engines: list[str], *extra: str) -> dict:
    out = work / f"{'-'.join(engines)}.json"
    assert marian.main(["--tiny", "--work", str(work), "--engines", ",".join(engines), "--json", str(out),
                        *extra]) == 0
    return json.loads(out.read_text())


def check_rows(result: dict, engines: list[str], workloads: list[str] = WORKLOADS) -> dict:
    assert result["errors"] == {}
    rows = {(r["engine"], r["workload"]): r for r in result["rows"]}
    assert set(rows) == {(e, w) for e in engines for w in workloads}
    for r in rows.values():
        assert r["all_lengths_equal_new_tokens"] and r["tokens"] == r["sentences"] * NEW_TOKENS
        assert r["pad_generated"] == 0
        assert r["median_s"] > 0 and r["tokens_per_s"] > 0 and len(r["seconds"]) == 1
    return rows


def test_twostep_and_ctranslate2(work):
    engines = ["twostep-fp32", "twostep-int8"]
    if installed("ctranslate2"):
        engines += ["ct2-fp32", "ct2-int8"]
    result = run(work, engines)
    rows = check_rows(result, engines)
    for w in WORKLOADS:  # exported fp32 decodes what eager transformers does, greedy and beam
        assert rows["twostep-fp32", w]["same_as_eager"] == rows["twostep-fp32", w]["sentences"]
    assert result["meta"]["cpu"] and result["meta"]["engines"]["twostep-fp32"]["backend"].startswith("ort-cpu")
    speedups = {(s["twostep"], s["other"], s["workload"]) for s in result["speedups"]}
    if "ct2-fp32" in engines:
        assert ("twostep-fp32", "ct2-fp32", "greedy batch 1") in speedups
        assert ("twostep-int8", "ct2-int8", "beam 4 batch 32") in speedups
        assert rows["ct2-fp32", "greedy batch 1"]["same_as_eager"] == rows["ct2-fp32", "greedy batch 1"]["sentences"]


@pytest.mark.skipif(not installed("optimum.onnxruntime"),
                    reason="Optimum (optimum-onnx) is not installed here: it needs transformers < 4.58; "
                           "benchmarks/marian.py runs it from its own venv (--optimum-python)")
def test_optimum(work):
    result = run(work, ["optimum"], "--optimum-python", sys.executable)
    check_rows(result, ["optimum"])


def test_a_missing_engine_is_reported_not_fatal(work):
    result = run(work, ["optimum"], "--optimum-python", str(work / "no-such-python"))
    assert "optimum" in result["errors"] and result["rows"] == []


def test_nllb(work):
    """Sources start with eng_Latn and fra_Latn is forced after the decoder start: every engine gives the asked-for
    tokens after it, and twostep fp32's and CTranslate2 fp32's are eager transformers'. (The int8 engines are the
    same code for every family: test_twostep_and_ctranslate2 runs them.)"""
    engines = ["twostep-fp32"] + (["ct2-fp32"] if installed("ctranslate2") else [])
    result = run(work, engines, "--family", "nllb")
    rows = check_rows(result, engines, NLLB_WORKLOADS)
    assert result["meta"]["family"] == "nllb" and result["meta"]["size"]["vocab"] == marian.NLLB_TINY.vocab
    for e in ("twostep-fp32", "ct2-fp32") if "ct2-fp32" in engines else ("twostep-fp32",):
        for w in NLLB_WORKLOADS:
            assert rows[e, w]["same_as_eager"] == rows[e, w]["sentences"], (e, w)


def test_nllb_layout(tmp_path):
    """The NLLB directory's ids: the tokenizer's 298 ids (4 specials, the BPE names, 202 codes, <mask>) below the
    embedding's 300 rows, the codes where NllbTokenizer puts them; sources and the forced prefix use them."""
    from transformers import AutoConfig, AutoTokenizer

    size = marian.NLLB_TINY
    hf = marian.build_nllb_model(tmp_path / "hf", size)
    tokenizer = AutoTokenizer.from_pretrained(hf)
    assert len(tokenizer) == size.vocab - 2 and AutoConfig.from_pretrained(hf).vocab_size == size.vocab
    first = marian.NLLB.first_code(size)
    assert tokenizer.convert_ids_to_tokens(first) == "ace_Arab"
    assert tokenizer.convert_tokens_to_ids("<mask>") == size.vocab - 3
    assert marian.target_prefix(marian.NLLB, size) == [tokenizer.convert_tokens_to_ids("fra_Latn")]
    sources = marian.make_sentences(4, marian.NLLB, size)
    assert all(s[0] == tokenizer.convert_tokens_to_ids("eng_Latn") and s[-1] == 2 for s in sources)
    assert all(4 <= i < first for s in sources for i in s[1:-1])
