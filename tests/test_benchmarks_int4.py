"""benchmarks/int4.py on its tiny T5 model (--smoke): twostep fp32 and int4 each decode every sentence to exactly
the asked-for tokens at batch 1; the int4 artifact is a sweep setting's, the fp32 artifact quantized again with
it; a step's weight bytes shrink with the precision, and the table carries the floor. (Speed itself is measured
by the benchmark, never asserted in tests.) The int8 and CTranslate2 engines and `twostep export`'s artifacts are
benchmarks/t5.py's prepare, whose smoke test runs them (tests/test_benchmarks_t5.py); `--dtype int4`'s export is
tests/exporter/test_int4.py's."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the int4 benchmark builds its model with transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package
from benchmarks import int4  # noqa: E402
from twostep.exporter.int4 import QUANTIZATION  # noqa: E402

pytestmark = pytest.mark.slow

SWEPT = "twostep-int4-b64-sym-a1"


def test_smoke(tmp_path):
    engines = ["twostep-fp32", SWEPT]
    out = tmp_path / "int4.json"
    assert int4.main(["--smoke", "--work", str(tmp_path), "--engines", ",".join(engines), "--json", str(out),
                      "--markdown", str(tmp_path / "int4.md")]) == 0
    result = json.loads(out.read_text())
    rows = {r["engine"]: r for r in result["rows"]}
    assert list(rows) == engines
    for r in rows.values():
        assert r["sentences"] == 2 and r["all_lengths_equal_new_tokens"], r["engine"]
        assert 0 < r["min_ms_per_token"] <= r["ms_per_token"] <= r["max_ms_per_token"]
        assert r["floor_ms"] > 0 and r["times_floor"] > 0
    assert rows["twostep-fp32"]["same_as_fp32"] == 2
    assert rows[SWEPT]["quantization"] == {**QUANTIZATION, **int4.SWEEP[SWEPT]}
    assert rows["twostep-fp32"]["step_bytes"] > 3 * rows[SWEPT]["step_bytes"], rows
    assert result["meta"]["bandwidth"]["bytes_per_s"] > 0 and result["meta"]["size"]["name"] == "smoke"
    assert f"| {SWEPT} |" in (tmp_path / "int4.md").read_text()


def test_the_shape_arguments_make_madlad_400_3b():
    """--madlad-3b, and the same shape given piece by piece (its numbers from the model's config.json)."""
    size = int4.MADLAD_3B
    assert (size.d_model, size.layers, size.heads, size.d_kv, size.d_ff, size.rows) == (1024, 32, 16, 128, 8192,
                                                                                         256000)
    assert int4.size_of(int4.parser().parse_args(["--madlad-3b"])) == size
    assert int4.size_of(int4.parser().parse_args(
        "--d-model 1024 --layers 32 --heads 16 --d-kv 128 --d-ff 8192 --vocab 256000".split())) == (
        replace(size, name="custom"))
