"""benchmarks/glossary.py on the demo model, a dozen sentences: every measure is reported, and the glossary is
used where its terms are found. (Speed is the benchmark's to measure, never asserted here.)"""

from __future__ import annotations

import json

from benchmarks import glossary


def test_smoke(tmp_path, demo_artifact):
    out = tmp_path / "result.json"
    assert glossary.main(["--smoke", "--demo-artifact", str(demo_artifact), "--json", str(out), "--markdown",
                          str(tmp_path / "table.md")]) == 0
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert row["model"] == "demo" and row["sentences"] == 12
    for label in ("greedy", "beam4"):
        without, with_ = row[f"{label}_without"], row[f"{label}_with"]
        assert without["terms"] == with_["terms"] > 0
        assert with_["term_usage"] == 1.0 and row[f"{label}_unmet"] == 0
        assert 0 < without["chrf"] <= 100 and 0 < with_["chrf"] <= 100
    assert set(row["speed"]) == {"matched", "unmatched"}
    for part in row["speed"].values():
        assert part["sentences"] > 0 and part["without_s"] > 0 and part["with_s"] > 0
    assert "| demo | matched |" in (tmp_path / "table.md").read_text()
