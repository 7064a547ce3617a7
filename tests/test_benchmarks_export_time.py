"""benchmarks/export_time.py on the tiny Marian model: every installed converter runs and writes what
benchmarks/marian.py reads, and the table gives the ratio to Optimum when Optimum ran. (The times themselves are
the benchmark's to measure, never asserted in tests.)"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the benchmark builds its model with transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package
from benchmarks import export_time  # noqa: E402

pytestmark = pytest.mark.slow


def test_every_installed_converter_is_timed_and_leaves_its_output(tmp_path):
    engines = ["twostep-fp32"] + (["ct2-fp32"] if importlib.util.find_spec("ctranslate2") else [])
    out = tmp_path / "times.json"
    assert export_time.main(["--tiny", "--work", str(tmp_path), "--engines", ",".join(engines), "--json",
                             str(out), "--markdown", str(tmp_path / "times.md")]) == 0
    result = json.loads(out.read_text())
    assert result["errors"] == {}
    rows = {r["engine"]: r for r in result["rows"]}
    assert set(rows) == {*engines, "twostep-import"}
    for engine in engines:
        assert rows[engine]["median_s"] > 0 and rows[engine]["bytes"] > 0
    assert (tmp_path / "tiny" / "twostep-fp32" / "manifest.json").is_file()  # where marian.py looks
    assert result["twostep_fp32_total_s"] == pytest.approx(rows["twostep-import"]["median_s"]
                                                           + rows["twostep-fp32"]["median_s"])
    assert result["ratio_to_optimum"] is None  # Optimum was not asked for
    assert "twostep fp32 (ort-cpu)" in (tmp_path / "times.md").read_text()
