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
                               "--drop-hf", "--json", str(out), "--markdown", str(tmp_path / "memory.md")]) == 0
    result = json.loads(out.read_text())
    # the converters of the transformers files first, then those files dropped (--drop-hf), then twostep's exports
    assert list(result["rows"]) == ["twostep import", *engines[1:], "twostep-fp32"]
    assert not (tmp_path / "smoke" / "hf").exists() and (tmp_path / "smoke" / "ckpt").is_dir()
    for row in result["rows"].values():
        assert row["returncode"] == 0 and row["pss"] > 0 and row["rss"] >= row["pss"] and row["seconds"] > 0
    assert result["rows"]["twostep-fp32"]["bytes"] > 0
    assert "| twostep-fp32 |" in (tmp_path / "memory.md").read_text()


def test_a_tree_past_the_limit_is_killed_whole():
    """A child holding 400 MB under a parent that waits: past a 200 MB limit both are killed, and the peak says so."""
    import subprocess
    import sys
    import time

    from benchmarks.memory import measure

    child = "import time; b = bytearray(400 << 20); time.sleep(60)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    started = time.perf_counter()
    peak = measure([sys.executable, "-c", parent], interval=0.05, limit=200 << 20, stdout=subprocess.DEVNULL)
    assert peak.stopped and peak.returncode == -9 and peak.processes == 2
    assert peak.pss > 200 << 20 and time.perf_counter() - started < 30
