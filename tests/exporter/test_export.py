"""Export (twostep/exporter/export.py): what the manifest records, a failed export leaves nothing behind, the
in-place decoder by default."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import twostep
from twostep.artifact import load_artifact
from twostep.errors import ParityFailure
from twostep.exporter import validate
from twostep.exporter.export import export


def test_manifest_describes_the_artifact(demo_artifact, demo_model_dir):
    m = json.loads((demo_artifact / "manifest.json").read_text())
    assert m["schema_version"] == 3 and m["dtype"] == "float32" and m["opset"] == 18
    assert set(m["files"]) == {"encoder.onnx", "decoder.onnx", "tokenizer.model"}
    assert m["special_tokens"] == {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
    dec = {t["name"]: t for t in m["graphs"]["decoder"]["inputs"]}
    assert dec["past_key_self_0"]["shape"] == ["batch", 4, "past_len", 32]
    assert m["validation"]["tolerances"]["logits"] == [1e-4, 1e-4]
    assert all(err < 1e-4 for err in m["validation"]["max_error"].values())
    assert {"torch", "onnx", "onnxruntime"} <= set(m["exporter"]["versions"])


def test_the_manifest_records_the_export_grid(demo_artifact):
    validation = load_artifact(demo_artifact).manifest.validation
    grid = validate.EXPORT_GRID
    assert validation["shape_grid"] == grid.to_dict()
    assert validation["cases"] == len(grid.batch) * len(grid.src_len) * (1 + len(grid.past_len) * len(grid.new_len))


def test_graphs_built_in_worker_processes_equal_those_built_here(tiny_ckpt, tmp_path):
    """jobs=3: the decoder and the in-place decoder in two worker processes, the encoder here; byte for byte
    what one process writes."""
    here = json.loads((export(tiny_ckpt, tmp_path / "here", jobs=1).path / "manifest.json").read_text())
    away = json.loads((export(tiny_ckpt, tmp_path / "away", jobs=3).path / "manifest.json").read_text())
    assert "decoder_inplace.onnx" in here["files"]
    assert away["files"] == here["files"]


def test_a_worker_process_error_is_raised_here(tiny_model, tiny_ckpt, tmp_path):
    """A user error in a worker comes back as the same error, one line; a crash as a RuntimeError that
    carries the worker's traceback."""
    import dataclasses

    from twostep.artifact.spec import GRAPHS
    from twostep.errors import BadCheckpoint
    from twostep.exporter.export import build_graphs

    (tmp_path / "empty").mkdir()
    with pytest.raises(BadCheckpoint) as caught:  # the worker loads the checkpoint from its directory
        build_graphs(tiny_model, tmp_path / "empty", [GRAPHS["decoder"], GRAPHS["encoder"]], tmp_path, 18, False,
                     "fp32", jobs=2, answers=tmp_path / "answers")
    assert "empty" in str(caught.value) and "Traceback" not in str(caught.value)
    unknown = dataclasses.replace(GRAPHS["encoder"], name="no_such_graph")
    with pytest.raises(RuntimeError, match=r"(?s)building no_such_graph failed.*Traceback.*KeyError"):
        build_graphs(tiny_model, tiny_ckpt, [unknown, GRAPHS["encoder"]], tmp_path, 18, False, "fp32", jobs=2,
                     answers=tmp_path / "answers")


def worker_processes(parent: int) -> list[int]:
    """Pids of the export worker processes whose parent is `parent` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"twostep.exporter.worker" in cmdline:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the worker processes in Linux's /proc")
def test_a_killed_export_takes_its_worker_processes_with_it(tiny_ckpt, tmp_path):
    """SIGKILL to `twostep export` while its workers build graphs: no worker goes on writing into the
    temporary directory that the next run cleans up."""
    command = [sys.executable, "-m", "twostep.cli", "export", str(tiny_ckpt), "--out", str(tmp_path / "art"), "--jobs",
               "3"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(workers := worker_processes(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(workers) == 2, "the export should have started two workers"
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 1.5  # a worker alone lives for seconds more: importing torch, tracing
    while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [pid for pid in workers if Path(f"/proc/{pid}").exists()
             and b"twostep.exporter.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert alive == [], "worker processes outlived the killed export"


def test_failed_export_leaves_nothing_behind(tiny_ckpt, tmp_path, monkeypatch):
    monkeypatch.setitem(validate.TOLERANCES, "fp32", {"logits": (0.0, 0.0), "kv": (0.0, 0.0)})
    with pytest.raises(ParityFailure, match="parity failure"):
        export(tiny_ckpt, tmp_path / "out" / "art")
    # neither the artifact nor its temporary directory, nor the parent directory the export created
    assert sorted(p.name for p in tmp_path.iterdir()) == [tiny_ckpt.name]


@pytest.mark.slow
def test_base_preset_exports_and_validates(base_export):
    result = base_export
    grid = validate.EXPORT_GRID
    assert result.report.ok and result.report.cases == len(grid.batch) * len(grid.src_len) * (
        1 + len(grid.past_len) * len(grid.new_len))  # plain graphs only: no sessions
    assert load_artifact(result.path).config.d_model == 512


def test_a_default_export_carries_the_in_place_decoder_that_ort_cpu_and_serve_decode_with(demo_inplace):
    """The fast path is the default: written wherever the model allows it, its shared weights stored once (as
    external data inside decoder.onnx, which stays what other runtimes read), chosen by ort-cpu, and a server
    batching in flight on it has nothing to warn about."""
    from twostep.artifact.spec import GRAPHS, INPLACE, STANDARD_INPLACE
    from twostep.artifact.trust import external_data_locations
    from twostep.exporter.export import chosen_variants
    from twostep.runtime.backends.ort import OrtBackend
    from twostep.serving.executor import batching_advice
    from twostep.serving.limits import BatchLimits

    art = load_artifact(demo_inplace.path)
    assert chosen_variants(art.config, "fp32", None) == [GRAPHS[INPLACE]]  # the standard one only when asked
    assert list(art.variants) == [INPLACE, STANDARD_INPLACE]  # (demo_inplace asks for it)
    assert external_data_locations(art.graph_file("decoder")) == set()
    plain = sum(art.graph_file(g).stat().st_size for g in art.graphs)
    for variant in (INPLACE, STANDARD_INPLACE):
        assert external_data_locations(art.graph_file(variant)) == {"decoder.onnx"}
        assert art.graph_file(variant).stat().st_size < 0.15 * plain  # the packed projections, not a second decoder
    with OrtBackend(art) as backend:
        assert backend.decoder == INPLACE and batching_advice(backend, BatchLimits()) is None


def test_no_inplace_cache_writes_the_plain_graphs_only(tiny_ckpt, tmp_path):
    assert twostep("export", tiny_ckpt, "--out", tmp_path / "art", "--no-inplace-cache", "--jobs", "1").returncode == 0
    assert load_artifact(tmp_path / "art").variants == {}
    assert not (tmp_path / "art" / "decoder_inplace.onnx").exists()


def test_an_export_the_disk_cannot_hold_is_refused_before_anything_is_written(tiny_ckpt, tmp_path, monkeypatch):
    """The disk the export will take (export.disk_needed) against what the disk has free, checked before the
    output directory exists. The need is made larger than any disk by the share of a weight's bytes."""
    import shutil

    from cli_helpers import leftovers
    from twostep.errors import BadInput
    from twostep.exporter import export as exporting

    out = tmp_path / "out" / "art"
    out.parent.mkdir()
    monkeypatch.setitem(exporting.WEIGHT_SHARE, "fp32", shutil.disk_usage(tmp_path).free)
    with pytest.raises(BadInput, match=r"not enough disk space for the artifact at .*art: the export needs about "
                                       r"[0-9.]+ GB there while it runs, [0-9.]+ GB are free"):
        exporting.export(tiny_ckpt, out, jobs=1)
    assert list(out.parent.iterdir()) == [] and leftovers(out.parent) == []
