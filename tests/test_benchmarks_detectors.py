"""benchmarks/detectors.py in seconds (one text a bucket and language): every installed engine is scored on every
language of the gold set, one that is not installed is skipped, the memory of one engine is measured in a process
of its own, and the scoring itself is right (the gold set scores 1.0 against itself, a detector that never answers
0, the served set holds only served languages). (Speed and memory are the benchmark's to measure, never asserted.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package
from benchmarks import detectors  # noqa: E402

LANGUAGES = {"en", "fr", "de", "es", "it", "pt", "nl", "ru", "zh-Hans", "ja", "ar", "pl", "tr"}


def installed(name: str) -> bool:
    return detectors.engine(name) is not None


def small_gold(tmp_path: Path) -> Path:
    """The gold set's first text of each bucket and language."""
    gold = {tag: {bucket: texts[:1] for bucket, texts in buckets.items()}
            for tag, buckets in detectors.load_gold().items()}
    path = tmp_path / "gold.json"
    path.write_text(json.dumps({"languages": gold}, ensure_ascii=False))
    return path


def test_every_installed_engine_is_scored_on_every_language_and_a_missing_one_skipped(tmp_path):
    out, table = tmp_path / "detectors.json", tmp_path / "detectors.md"
    assert detectors.main(["--repeat", "1", "--no-memory", "--gold", str(small_gold(tmp_path)),
                           "--json", str(out), "--markdown", str(table)]) == 0
    result = json.loads(out.read_text())
    engines = [e for e in detectors.ENGINES if installed(e)]
    assert {"twostep", "lingua"} <= set(engines)  # the product's own detector is always measured
    assert result["skipped"] == [e for e in detectors.ENGINES if e not in engines]
    assert result["served"] == ["en", "fr", "de", "es", "it", "pt"]
    assert result["texts"] == {"full": 4 * len(LANGUAGES), "served": 4 * 6}
    for engine in engines:
        rows = {r["set"]: r for r in result["rows"] if r["engine"] == engine}
        assert set(rows) == {"full", "served"}
        assert set(rows["full"]["per_language"]) == LANGUAGES
        assert set(rows["served"]["per_language"]) == set(result["served"])
        for row in rows.values():
            buckets = row["buckets"]
            assert set(buckets) == set(detectors.BUCKETS)
            assert all(0 <= b["accuracy"] <= 1 and b["ms_per_text"] > 0 for b in [*buckets.values(), row["all"]])
            assert row["all"]["right"] == sum(b["right"] for b in buckets.values())
            assert row["all"]["texts"] == sum(b["texts"] for b in buckets.values()) == result["texts"][row["set"]]
    lines = table.read_text().splitlines()
    assert lines[0] == "| engine | set | word | phrase | sentence | paragraph | all | ms / text | MB | cold s |"
    twostep = next(r for r in result["rows"] if r["engine"] == "twostep" and r["set"] == "full")
    row = next(line for line in lines if line.startswith("| twostep | full |"))
    assert f"| {twostep['buckets']['sentence']['accuracy']:.2f} |" in row and row.endswith("| - | - |")
    assert twostep["buckets"]["sentence"]["accuracy"] == twostep["buckets"]["paragraph"]["accuracy"] == 1.0


def test_an_engine_not_installed_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setitem(detectors.MODULES, "lexilang", "no_such_module_here")
    result = detectors.run(["lexilang"], small_gold(tmp_path), ["en"], 1, memory=False)
    assert result["skipped"] == ["lexilang"] and result["rows"] == []


def test_the_memory_of_an_engine_is_measured_in_a_process_of_its_own(tmp_path):
    engine = "lexilang" if installed("lexilang") else "twostep"
    got = detectors.measure_footprint(engine, ["en", "fr"], small_gold(tmp_path))
    assert set(got) == {"mb", "cold_s"} and got["mb"] > 0 and got["cold_s"] > 0


def test_the_scoring_counts_right_answers_against_the_gold_set():
    gold = detectors.load_gold()
    assert set(gold) == LANGUAGES
    for buckets in gold.values():
        assert set(buckets) == set(detectors.BUCKETS) and sum(len(texts) for texts in buckets.values()) >= 20
    truth = {text: tag for tag, buckets in gold.items() for texts in buckets.values() for text in texts}
    for bucket in detectors.BUCKETS:
        pairs = detectors.items(gold, list(gold), bucket)
        assert detectors.score(truth.get, pairs) == {"right": len(pairs), "texts": len(pairs), "accuracy": 1.0}
        assert detectors.score(lambda text: None, pairs)["accuracy"] == 0.0
        served = detectors.items(gold, ["fr", "de"], bucket)
        assert {tag for tag, _ in served} == {"fr", "de"}
        assert len(served) == len(gold["fr"][bucket]) + len(gold["de"][bucket])


def test_engine_codes_map_onto_the_candidate_tags():
    match = detectors.matcher(["en", "zh-Hans", "pt-BR"])
    assert [match(code) for code in ["en", "zh-cn", "zh", "pt", "zh-tw", "fr", ""]] == \
        ["en", "zh-Hans", "zh-Hans", "pt-BR", "zh-Hans", None, None]
    both = detectors.matcher(["zh-Hans", "zh-Hant"])
    assert (both("zh-cn"), both("zh-tw")) == ("zh-Hans", "zh-Hant")
