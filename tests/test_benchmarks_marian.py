"""benchmarks/marian.py on a tiny Marian model: every installed engine runs every workload, generates exactly
the asked-for tokens and never the pad id; twostep fp32 reproduces eager transformers. (Speed itself is
measured by the benchmark, never asserted in tests.)"""

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


def check_rows(result: dict, engines: list[str]) -> dict:
    assert result["errors"] == {}
    rows = {(r["engine"], r["workload"]): r for r in result["rows"]}
    assert set(rows) == {(e, w) for e in engines for w in WORKLOADS}
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
