"""benchmarks/libretranslate.py on the tiny models (--tiny), 1 client and a handful of requests: the twostep side
always, with LibreTranslate's side skipped and its reason given when its venv is absent (nothing is installed:
--no-install); both sides where that venv exists (made by a run of the benchmark). The JSON carries the rows, the
same-text rates and the ratios. (Speed is the benchmark's to measure, never asserted here.)"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("aiohttp", reason="the load's client (pip install -e '.[bench]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")
pytest.importorskip("ctranslate2", reason="the packages are converted by CTranslate2's converter")
from benchmarks import libretranslate  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The packages and artifacts, built by the first test and reused by the second."""
    return tmp_path_factory.mktemp("libretranslate-work")


def run(tmp_path, work, venv) -> dict:
    out = tmp_path / "result.json"
    assert libretranslate.main(["--tiny", "--clients", "1", "--requests", "6", "--seconds", "60", "--work", str(work),
                                "--lt-venv", str(venv), "--no-install", "--json", str(out), "--markdown",
                                str(tmp_path / "table.md")]) == 0
    return json.loads(out.read_text())


def check_rows(result: dict, engines: set[str]) -> None:
    rows = {(r["size"], r["engine"], r["clients"]): r for r in result["rows"]}
    assert set(rows) == {("small", e, 1) for e in engines}  # --tiny: the small pairs only
    for r in rows.values():
        assert r["ok"] == r["sent"] == 6 and r["errors"] == 0
        assert r["requests_per_s"] > 0 and r["sentences_per_s"] > r["requests_per_s"] and 0 < r["p50_ms"] <= r["p99_ms"]
    meta = result["meta"]
    assert meta["cpu"] and meta["cores"] > 0 and meta["load_mix"]["mastodon"] > 0 and meta["pairs"]


def test_twostep_side_without_libretranslate(tmp_path, work):
    result = run(tmp_path, work, tmp_path / "no-venv")
    assert "--no-install" in result["meta"]["skipped"]["libretranslate"]
    assert not (tmp_path / "no-venv").exists()
    check_rows(result, {"twostep"})
    assert result["same"]["compared"] is False and result["ratios"] == []
    assert "| small | 1 | twostep serve | 6 |" in (tmp_path / "table.md").read_text()


def test_both_sides(tmp_path, work):
    if not libretranslate.lt_installed(libretranslate.DEFAULT_VENV):
        pytest.skip(f"no LibreTranslate venv at {libretranslate.DEFAULT_VENV} (python -m benchmarks.libretranslate "
                    "makes it)")
    result = run(tmp_path, work, libretranslate.DEFAULT_VENV)
    check_rows(result, {"twostep", "libretranslate"})
    kinds = result["same"]["kinds"]
    assert set(kinds) == {"text", "mastodon", "libretranslatepy"}
    for row in kinds.values():
        assert row["requests"] > 0 and 0 <= row["identical_rate"] <= 1
    (ratio,) = result["ratios"]
    assert (ratio["size"], ratio["clients"]) == ("small", 1)
    assert ratio["throughput"] > 0 and isinstance(ratio["p50_met"], bool)
    assert result["meta"]["versions"]["libretranslate"] == libretranslate.LT_VERSION
