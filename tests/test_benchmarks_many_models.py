"""benchmarks/many_models.py in seconds, on the session's tiny Argos artifact: four pairs (copies of it, their
manifests' languages renamed), one client, a second of load; the report holds every part with positive numbers,
every pair answers and its table says what it measured. (Speed is the benchmark's to measure, never asserted.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the load test's client (pip install -e '.[bench]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_many_models_measures_memory_throughput_and_a_server_of_many_pairs(argos_artifact, tmp_path):
    out, table = tmp_path / "report.json", tmp_path / "report.md"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.many_models", "--work", str(tmp_path / "work"),
                           "--size", "tiny", "--artifact", str(argos_artifact), "--pairs", "4", "--max-loaded", "2",
                           "--clients", "1", "--seconds", "1", "--runs", "1", "--json", str(out),
                           "--markdown", str(table)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["pairs"] == ["en-ar", "ar-en", "en-az", "az-en"]

    memory = report["memory"]["tiny"]
    assert set(memory["rss"]) == {"1", "2", "3"}
    for rss in memory["rss"].values():
        assert 0 < rss["ready_mib"] <= rss["after_request_mib"] and rss["ready_s"] > 0
    assert set(memory["per_model"]) == {"ready_mib", "after_request_mib"}  # a difference: no sign asserted

    throughput = report["throughput"]
    assert throughput["levels"] == [1] and throughput["runs"] == 1
    assert set(throughput["workloads"]) == {"1 model", "3 loaded, 1 busy", "3 loaded, 3 busy",
                                            "3 loaded, 1 busy, --threads 1", "3 loaded, 3 busy, --threads 1"}
    for name, by in throughput["workloads"].items():
        x = by["1"]
        assert x["tokens_per_s"] > 0 and x["requests_per_s"] > 0 and x["p50_ms"] > 0 and x["errors"] == 0, name
        assert len(x["per_pair_tokens_per_s"]) == (3 if "3 busy" in name else 1), name
        assert all(v > 0 for v in x["per_pair_tokens_per_s"].values()), name

    many = report["many"]
    assert many["answered"] == many["pairs"] == 4 and many["failed"] == []
    assert many["ready_s"] > 0 and many["rss_ready_mib"] > 0 and many["rss_after_mib"] > 0
    assert many["loaded_at_ready"] == 2 and many["loaded_max"] == 2 and many["loads"] >= 4 and many["unloads"] >= 2
    assert many["languages"] == {"sources": 3, "direct_pairs": 4, "pivoted_pairs": 2, "libretranslate_sources": 3}
    assert many["pivoted_request"] == {"pair": "ar-az", "status": 200}

    text = table.read_text()
    assert text.startswith("Machine: ")
    assert "| tiny |" in text and "| 1 |" in text and "not measured (--artifact)" in text
    assert "4/4 answered" in text
