"""int4 weights at batch 1: milliseconds per token of greedy decoding for one T5 model (MADLAD-400's family)
through twostep's fp32, int8 and int4 artifacts and CTranslate2 int8, in one run, each against the time it takes
to read its weights once.

    python -m benchmarks.int4 [--work DIR] [--d-model 512] [--d-kv 64] [--heads 8] [--layers 6] [--d-ff 2048]
                              [--vocab 32000] [--madlad-3b] [--sentences 8] [--new-tokens 32] [--iters 5]
                              [--threads 2] [--sweep] [--json OUT] [--markdown OUT] [--smoke]

The model: benchmarks/t5.py's random-weight mT5 (T5 v1.1: gated-gelu feed-forward, relative position buckets, an
lm_head of its own with weights normal with std d_model^-0.5), at the shape given: `--layers` encoder and as many
decoder layers, `--heads` heads of `--d-kv`, `--vocab` rows. `--madlad-3b` is MADLAD-400-3B's shape (32+32
layers, d_model 1024, 16 heads x 128, d_ff 8192, vocab 256000): 2.9 billion weights, 12 GB in fp32. Each export
stays within the memory of a 24 GiB machine, but the fp32 engine (12.6 GB mapped) beside the others does not:
run it with `--engines twostep-int8,twostep-int4,ct2-int8` there (docs/benchmarks.md, "int4").

The engines, each in its own worker process (benchmarks/t5.py's), `--threads` intra-op threads:

- twostep fp32 / int8 / int4: `twostep import`, then `twostep export --dtype fp32|int8|int4` (the in-place
  decoder, which ort-cpu decodes with, written by default), decoded by `open_translator` (ort-cpu).
- CTranslate2 int8: its TransformersConverter with quantization "int8" (benchmarks/t5.py's ct2_convert), compute
  type "default".
- `--sweep`: besides, int4 at every block size (32, 64, 128), symmetric and not, and accuracy level (0: unset,
  1: fp32 compute, 4: int8 compute): the fp32 artifact's graphs quantized again by twostep.exporter.int4 with those
  settings (requantize), for choosing QUANTIZATION by measurement; `--engines` may name some of them instead
  (twostep-int4-b64-asym-a4, ...).

The workload: `--sentences` random sources (10..40 pieces and </s>), one at a time, each decoded greedily for
exactly `--new-tokens` tokens (eos suppressed). Each engine is warmed up on one sentence, then `--iters` rounds run
every sentence, the engines' order rotated each round. Reported: ms per token, the median over every sentence of
every round of its milliseconds / new tokens (the encoder's one pass over the source counted in), and how many
sentences' tokens equal the fp32 artifact's.

The weight-read floor: a batch-1 step reads every weight of the decoder once. For twostep's artifacts that is the
bytes of every initializer of decoder.onnx that a node other than Gather reads (twostep.bench's
weight_bytes_per_step: an embedding lookup reads one row); for CTranslate2 int8 the decoder's matrices at a byte
a weight, a 4-byte scale a row and the fp32 norms (benchmarks/t5.py's step_weight_bytes). That, over the memory
bandwidth measured here (numpy copying a 512 MiB array in `--threads` threads, bytes read plus written, best of
5: benchmarks/t5.py's memory_bandwidth), is the least time a step can take; each ms per token is also given as a
multiple of its floor.

Run it on an otherwise idle machine (the load average before and after is printed). `--smoke`: benchmarks/t5.py's
tiny model (d_model 32, 2+2 layers, 312 rows), 2 sentences, 8 new tokens, 1 round: seconds, for the test.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks import t5
from benchmarks.marian import Worker, cpu_model, load_average, versions
from benchmarks.t5 import EXTRA_IDS, SMOKE, Size, make_sentences, memory_bandwidth, step_weight_bytes
from twostep.exporter.int4 import QUANTIZATION

ENGINES = ("twostep-fp32", "twostep-int8", "twostep-int4", "ct2-int8")
SMALL = Size("small", 32000, 32000 - EXTRA_IDS, 512, 64, 8, 6, 2048)  # the default: minutes on 2 cores
MADLAD_3B = Size("madlad-400-3b", 256000, 256000 - EXTRA_IDS, 1024, 128, 16, 32, 8192)
SWEEP = {f"twostep-int4-b{block}-{'sym' if symmetric else 'asym'}-a{level}":
         {"block_size": block, "symmetric": symmetric, "accuracy_level": level}
         for block, symmetric, level in itertools.product((32, 64, 128), (True, False), (0, 1, 4))}


def requantize(fp32: Path, out: Path, **settings) -> Path:
    """An int4 artifact at `out` from the fp32 artifact at `fp32`, its graphs quantized by quantize_int4 with
    `settings` (block_size, symmetric, accuracy_level), its variants' weights shared as export shares them; not
    validated again (the fp32 one was)."""
    import onnx

    from twostep.artifact import load_artifact, write_manifest
    from twostep.artifact.spec import GRAPHS
    from twostep.exporter import shared
    from twostep.exporter.export import store_weights
    from twostep.exporter.int4 import quantize_int4

    manifest = load_artifact(fp32).manifest
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    graphs = [GRAPHS[name] for name in manifest.graphs]
    quantization = None
    for info in graphs:
        shared.save_graph(onnx.load(str(fp32 / info.file)), tmp / info.file)  # its weights in the file, or its own
        quantization = quantize_int4(tmp / info.file, **settings)
    store_weights(tmp, graphs, once=(fp32 / shared.WEIGHTS).is_file())
    for name in manifest.tokenizer.files() if manifest.tokenizer else []:
        shutil.copyfile(fp32 / name, tmp / name)
    write_manifest(tmp, manifest.replace(precision="int4", quantization=quantization, validation=None))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def prepare(work: Path, size: Size, engines: list[str], log) -> tuple[dict[str, Path], dict[str, dict]]:
    """Build (or reuse) the model, its artifacts and conversions under work, as benchmarks/t5.py's prepare does, then
    the sweep's requantized artifacts: (paths, each build's seconds and load average)."""
    int4 = work / "twostep-int4"
    stale = (int4 / "manifest.json").is_file() and quantization_of(int4) != QUANTIZATION  # other settings' export
    paths, errors, seconds = t5.prepare(work, size, [e for e in engines if e in ENGINES], None, None, log,
                                        rebuild=("twostep-int4",) if stale and "twostep-int4" in engines else ())
    if errors:
        raise RuntimeError("; ".join(f"{e}: {why}" for e, why in errors.items()))
    for e in [e for e in engines if e in SWEEP]:
        paths[e] = work / e
        if not (paths[e] / "manifest.json").is_file() or quantization_of(paths[e]) != {**QUANTIZATION, **SWEEP[e]}:
            log(f"{e}: requantizing the fp32 artifact")
            started = time.perf_counter()
            requantize(paths["twostep-fp32"], paths[e], **SWEEP[e])
            seconds[e] = {"seconds": time.perf_counter() - started, "load_after": load_average()}
    return paths, seconds


def floor_bytes(engine: str, path: Path, size: Size) -> int:
    """The weight bytes a batch-1 decoder step reads (module docstring)."""
    if engine.startswith("twostep"):
        from twostep.bench import weight_bytes_per_step

        return weight_bytes_per_step(path / "decoder.onnx")
    return step_weight_bytes(size, "int8")["bytes"]


def rows_of(measured: dict, paths: dict[str, Path], size: Size, bandwidth: dict, new_tokens: int) -> list[dict]:
    """Each engine's row of benchmarks/t5.py's measure (one sentence a batch) as ms per token against its floor."""
    rows = []
    for (e, _), m in measured.items():
        step_bytes = floor_bytes(e, paths[e], size)
        floor_ms = 1000 * step_bytes / bandwidth["bytes_per_s"]
        median = m["median_batch_ms"] / new_tokens
        same = {e: m["sentences"], **m["same_as"]}
        rows.append({"engine": e, "ms_per_token": median, "min_ms_per_token": m["min_batch_ms"] / new_tokens,
                     "max_ms_per_token": m["max_batch_ms"] / new_tokens, "step_bytes": step_bytes,
                     "floor_ms": floor_ms, "times_floor": median / floor_ms, "sentences": m["sentences"],
                     "all_lengths_equal_new_tokens": m["all_lengths_equal_new_tokens"],
                     "same_as_fp32": same.get("twostep-fp32"),
                     "quantization": quantization_of(paths[e]) if e.startswith("twostep") else None})
    return rows


def quantization_of(path: Path) -> dict | None:
    return json.loads((path / "manifest.json").read_text()).get("quantization")


def report(meta: dict, rows: list[dict]) -> str:
    s, bw = meta["size"], meta["bandwidth"]
    lines = [f"CPU: {meta['cpu']} ({meta['cores']} cores); {meta['threads']} threads per engine; greedy batch 1, "
             f"{meta['sentences']} sentences x {meta['new_tokens']} new tokens, {meta['iters']} rounds (engines "
             f"rotated) after a warm-up; {meta['date']}; load average before/after {meta['load_average']['before']}/"
             f"{meta['load_average']['after']}; model {s['name']} (T5 v1.1: d_model {s['d_model']}, "
             f"{s['layers']}+{s['layers']} layers, {s['heads']} heads x {s['d_kv']}, d_ff {s['d_ff']} gated-gelu, "
             f"{s['rows']:,} rows)",
             f"memory bandwidth {bw['bytes_per_s'] / 1e9:.1f} GB/s ({bw['threads']} threads copying "
             f"{bw['array_mib']} MiB, read + written; one thread {bw['one_thread_bytes_per_s'] / 1e9:.1f} GB/s)", "",
             "| engine | median ms/token | min-max | weights read per step | floor ms/step | x floor | = fp32 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        same = "-" if r["same_as_fp32"] is None else f"{r['same_as_fp32']}/{r['sentences']}"
        lines.append(f"| {r['engine']} | {r['ms_per_token']:.2f} | {r['min_ms_per_token']:.2f}-"
                     f"{r['max_ms_per_token']:.2f} | {r['step_bytes'] / 2**20:,.2f} MiB | {r['floor_ms']:.2f} | "
                     f"{r['times_floor']:.2f} | {same} |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, help="model files are built here once and reused (default: a temp dir)")
    p.add_argument("--smoke", action="store_true", help="a tiny model, 2 sentences, 8 new tokens, 1 round: seconds")
    p.add_argument("--madlad-3b", action="store_true", help="MADLAD-400-3B's shape (the module docstring)")
    for name, default in (("d-model", SMALL.d_model), ("d-kv", SMALL.d_kv), ("heads", SMALL.heads),
                          ("layers", SMALL.layers), ("d-ff", SMALL.d_ff), ("vocab", SMALL.rows)):
        p.add_argument(f"--{name}", type=int, help=f"the model's shape (default {default})")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)} and the "
                   "sweep's int4 settings (twostep-int4-b{32,64,128}-{sym,asym}-a{0,1,4})")
    p.add_argument("--sweep", action="store_true", help="also int4 at every block size, symmetry and accuracy level")
    p.add_argument("--sentences", type=int, help="default 8; --smoke 2")
    p.add_argument("--new-tokens", type=int, help="default 32; --smoke 8")
    p.add_argument("--iters", type=int, help="timed rounds (default 5; --smoke 1)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bandwidth-mib", type=int, help="the bandwidth measure's array (default 512; --smoke 64)")
    p.add_argument("--json", type=Path, help="write every number here")
    p.add_argument("--markdown", type=Path, help="write the table here")
    return p


def size_of(args: argparse.Namespace) -> Size:
    """The model's shape: --smoke's, --madlad-3b's or SMALL, with any piece given on the command line."""
    size = SMOKE if args.smoke else MADLAD_3B if args.madlad_3b else SMALL
    shape = {k: v for k, v in (("d_model", args.d_model), ("d_kv", args.d_kv), ("heads", args.heads),
                               ("layers", args.layers), ("d_ff", args.d_ff), ("rows", args.vocab)) if v is not None}
    if shape:
        size = replace(size, name="custom", **shape, pieces=shape.get("rows", size.rows) - EXTRA_IDS)
    return size


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    size = size_of(args)
    n = args.sentences or (2 if args.smoke else 8)
    new_tokens = args.new_tokens or (8 if args.smoke else 32)
    iters = args.iters or (1 if args.smoke else 5)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    engines += [e for e in SWEEP if args.sweep and e not in engines]
    if set(engines) - set(ENGINES) - set(SWEEP):
        p.error(f"unknown engines {sorted(set(engines) - set(ENGINES) - set(SWEEP))}; choose from "
                f"{', '.join(ENGINES)} and --sweep's ({', '.join(SWEEP)})")
    if set(engines) & set(SWEEP) and "twostep-fp32" not in engines:
        p.error("the sweep's int4 artifacts are the fp32 one quantized again: keep twostep-fp32 among --engines")

    def log(msg: str) -> None:
        print(f"[int4 {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    shape = f"{size.d_model}x{size.layers}-h{size.heads}x{size.d_kv}-ff{size.d_ff}-v{size.rows}"
    work = (args.work or Path(tempfile.mkdtemp(prefix="twostep-int4-"))) / f"{size.name}-{shape}"  # one a shape
    (work / "logs").mkdir(parents=True, exist_ok=True)
    paths, build_seconds = prepare(work, size, engines, log)
    sentences = make_sentences(n, size)
    load_before = load_average()
    if load_before is not None and load_before > 0.5:
        log(f"warning: load average {load_before:.2f} before timing: something else is running")
    log("memory bandwidth")
    bandwidth = memory_bandwidth(args.threads, args.bandwidth_mib or (64 if args.smoke else 512))
    common = {"threads": args.threads, "new_tokens": new_tokens, "max_batch": 1, "max_beam": 1}
    workers: dict[str, Worker] = {}
    try:
        for e in engines:
            log(f"loading {e}")
            spec = {**common, "kind": e.split("-")[0], "path": str(paths[e])}
            workers[e] = Worker(e, sys.executable, spec, work / "logs" / f"{e}-worker.log", module="benchmarks.t5")
        measured = t5.measure(workers, sentences, [t5.Workload("greedy-b1", "greedy batch 1", 1, 1, n)], iters,
                              new_tokens, size, None, log)
    finally:
        for worker in workers.values():
            worker.close()
    rows = rows_of(measured, paths, size, bandwidth, new_tokens)
    meta = {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": args.threads, "sentences": n,
            "new_tokens": new_tokens, "iters": iters, "date": time.strftime("%Y-%m-%d %H:%M"), "size": asdict(size),
            "bandwidth": bandwidth, "engines": {e: w.info for e, w in workers.items()},
            "versions": versions("onnxruntime", "ctranslate2", "numpy"), "build_seconds": build_seconds,
            "command": " ".join(["python -m benchmarks.int4", *(argv if argv is not None else sys.argv[1:])]),
            "work": str(work), "load_average": {"before": load_before, "after": load_average()}}
    table = report(meta, rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
