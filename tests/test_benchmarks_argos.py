"""benchmarks/argos.py on its tiny model (--smoke): every engine runs every request size, sentences end at varied
lengths under the shared cap, and the table and JSON carry the CPU, CTranslate2's compute types and twostep's
speedups against the targets. (Speed itself is measured by the benchmark, never asserted in tests.)"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ctranslate2", reason="the Argos benchmark's model is converted by CTranslate2's converter")
from benchmarks import argos  # noqa: E402

pytestmark = pytest.mark.slow


def test_smoke(tmp_path, capsys):
    out = tmp_path / "result.json"
    assert argos.main(["--smoke", "--work", str(tmp_path), "--json", str(out), "--markdown",
                       str(tmp_path / "table.md")]) == 0
    result = json.loads(out.read_text())
    meta, rows = result["meta"], {(r["engine"], r["sentences_per_request"]): r for r in result["rows"]}
    assert set(rows) == {(e, n) for e in argos.ENGINES for n in (1, 8)}
    for r in rows.values():
        assert r["median_round_s"] > 0 and r["tokens_per_s"] > 0 and len(r["round_s"]) == 1
        assert r["requests"] == 8 // r["sentences_per_request"]
    for e in argos.ENGINES:  # the fitted </s> ends sentences at different lengths, under the cap
        lengths = meta["lengths"][f"{e}/1"]
        assert len(lengths) == 8 and len(set(lengths)) > 1 and max(lengths) < meta["new_tokens"], (e, lengths)
    assert meta["engines"]["ct2-fp32"]["compute_type"] == "float32"
    assert meta["engines"]["ct2-int8"]["compute_type"].startswith("int8")
    assert meta["engines"]["ct2-int8"]["batch_type"] == "tokens"
    assert meta["engines"]["twostep-int8"]["beam_stop"] == "ctranslate2"
    assert meta["cpu"] and ("AMX" in meta["cpu_features"] or "unknown" in meta["cpu_features"])
    ratios = {(s["twostep"], s["ctranslate2"], s["sentences_per_request"]): s for s in result["speedups"]}
    assert set(ratios) == {(a, b, n) for a, b, _ in argos.PAIRS for n in (1, 8)}
    assert ratios["twostep-int8", "ct2-int8", 1]["target"] == 1.5
    assert ratios["twostep-fp32", "ct2-fp32", 8]["target"] is None
    table = capsys.readouterr().out
    assert table == (tmp_path / "table.md").read_text()
    assert "CTranslate2 int8 (LibreTranslate's settings)" in table and "| 1.5x |" in table
