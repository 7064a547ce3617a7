"""benchmarks/request_path.py on the tests' Argos artifact: a handful of requests through a timed `twostep serve`,
each stage's calls counted and nested as the request path nests them. (Speed is the benchmark's to measure,
never asserted here.)"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")
pytest.importorskip("httpx", reason="the benchmark's client")
from benchmarks import request_path  # noqa: E402

pytestmark = pytest.mark.slow


def test_every_stage_of_a_request_is_timed(argos_artifact, tmp_path):
    out = tmp_path / "result.json"
    assert request_path.main([str(argos_artifact), "--requests", "6", "--warmup", "2", "--source", "en", "--target",
                              "fr", "--json", str(out), "--markdown", str(tmp_path / "table.md")]) == 0
    result = json.loads(out.read_text())
    stages = result["stages"]
    assert set(stages) == set(request_path.STAGES)
    for stage in ("http", "translate", "encode", "submit", "wait"):  # once a request, the warm-up's forgotten
        assert stages[stage]["calls"] == 6, stage
    assert stages["step"]["calls"] > 6 and stages["join"]["calls"] >= 1
    ms = {stage: row["per_request_ms"] for stage, row in stages.items()}
    assert 0 < ms["encode"] + ms["submit"] + ms["wait"] <= ms["translate"] <= ms["http"]
    assert ms["join"] + ms["step"] <= ms["wait"] * 1.05  # the worker's work lies inside the requests' wait
    assert 0 < result["client_p50_ms"] and result["requests"] == 6
    assert "| step |" in (tmp_path / "table.md").read_text()
