"""benchmarks/serve_load.py --scenario clients in seconds, on the demo artifact: a real server, streamed and
whole answers, a document as one request and as one request a sentence; the report holds each, and its table
says what it measured. (Speed is the benchmark's to measure, never asserted here.)"""

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


def test_the_clients_scenario_measures_streams_and_documents(demo_artifact, tmp_path):
    (tmp_path / "demo-art").symlink_to(demo_artifact)  # prepare() finds the preset's artifact there
    table = tmp_path / "clients.md"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.serve_load", "--scenario", "clients", "--work",
                           str(tmp_path), "--clients", "2", "--requests", "4", "--stream-tokens", "8",
                           "--document-sentences", "3", "--repeats", "1", "--markdown", str(table)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)["clients_scenario"]
    for label in ("whole answer", "streamed"):
        r = report[label]
        assert 0 < r["first_p50_ms"] <= r["total_p50_ms"] and r["requests_per_s"] > 0
    assert report["whole answer"]["first_p50_ms"] == report["whole answer"]["total_p50_ms"]
    assert set(report["document"]) == {"one document request", "a request a sentence, all at once",
                                       "a request a sentence, one after another"}
    assert all(seconds > 0 for seconds in report["document"].values())
    text = table.read_text()
    assert "| streamed |" in text and "| one document request |" in text and "1.00x" in text
