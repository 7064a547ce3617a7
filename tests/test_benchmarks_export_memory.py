"""benchmarks/export_memory.py at its smoke shape: every conversion runs under the process-tree sampler and the
table names its peak against the budget. (The figures themselves are the benchmark's to measure, never asserted
in tests.)"""

from __future__ import annotations

import importlib.util
import json

import pytest

from benchmarks import export_memory

pytest.importorskip("transformers", reason="the benchmark builds its model with transformers")
pytestmark = pytest.mark.slow


def test_every_conversion_is_measured(tmp_path):
    engines = ["twostep-fp32"] + (["ct2-fp32"] if importlib.util.find_spec("ctranslate2") else [])
    out = tmp_path / "memory.json"
    assert export_memory.main(["--shape", "smoke", "--work", str(tmp_path), "--engines", ",".join(engines),
                               "--json", str(out), "--markdown", str(tmp_path / "memory.md")]) == 0
    result = json.loads(out.read_text())
    assert set(result["rows"]) == {"twostep import", *engines}
    for row in result["rows"].values():
        assert row["returncode"] == 0 and row["pss"] > 0 and row["rss"] >= row["pss"] and row["seconds"] > 0
    assert result["rows"]["twostep-fp32"]["bytes"] > 0
    assert "| twostep-fp32 |" in (tmp_path / "memory.md").read_text()
