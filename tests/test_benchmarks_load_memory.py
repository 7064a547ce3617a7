"""benchmarks/load_memory.py on the demo artifact: `twostep translate` and `twostep serve` each run in a sampled
process tree, the server is started on a free loopback port, answers one request and is stopped; the table
names each peak against the artifact's bytes. (The figures are the benchmark's to measure, never asserted.)"""

from __future__ import annotations

import json

import pytest

from benchmarks import load_memory

pytestmark = pytest.mark.slow


def test_translate_and_serve_are_measured(demo_artifact, tmp_path):
    out = tmp_path / "load.json"
    assert load_memory.main([str(demo_artifact), "--sentence", "three hundred and forty-two", "--json", str(out),
                             "--markdown", str(tmp_path / "load.md")]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert len(rows) == 2 and all(row["pss"] > 0 and row["seconds"] > 0 for row in rows.values())
    served = rows["twostep serve (start to ready + one request)"]
    assert 0 < served["ready_seconds"] < served["seconds"]
    assert result["answer"]["translations"][0][0]["text"]
    assert result["artifact_bytes"] > 0 and "| twostep serve" in (tmp_path / "load.md").read_text()
