"""CPU benchmark of twostep against CTranslate2 and the seeds' no-cache greedy loop, in one process tree and
one table; then how the cost per step grows with the output length, and the machine's memory bandwidth.

    python -m benchmarks.cpu [--work DIR] [--batch 1,32] [--beam 4 --beam-batch 32] [--new-tokens 64]
                             [--growth-batch 16 --growth-tokens 64,512] [--threads 2] [--markdown FILE]

The paper's base model (d_model 512, 6+6 layers, 8 heads, d_ff 2048, vocab 32000) with random weights;
source length 32; greedy and beam search with EOS suppressed so every engine generates the same number of
tokens. Every engine runs in its own child process, one after the other, on the same source sentences.
twostep's artifacts carry the in-place decoder (`export --inplace-cache`), which ort-cpu decodes with;
`ort-cpu:concat` is the plain decoder, for comparison. CTranslate2 is converted from the same checkpoint
and checked against eager PyTorch (fp32) before it is timed: greedy tokens identical, and how many beam
search results are.

Batch 1 is bound by reading the decoder's weights once a step: the bandwidth probe (numpy reductions over
256 MB in as many threads as the engines get, before and after the engines run) gives the floor, weight
bytes / bandwidth, and the table reads batch-1 steps as multiples of it. Batched steps are bound by the
decoder's weight products instead: ONNX Runtime times those products alone at batch x beam rows, after the
engines (twostep.bench.gemm_floor: the fp32 decoder's for fp32 engines, the int8 decoder's for int8 ones,
CTranslate2's included), and the table reads batched steps as multiples of that GEMM floor.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from twostep.bench import (
    Floor,
    Result,
    Workload,
    add_gemm_floors,
    make_sources,
    measure,
    memory_bandwidth_gbs,
    peak_rss_mb,
    run_backend,
    run_in_child,
    weight_bytes_per_step,
)

console = Console(stderr=True)


def ct2_engine(ct2_dir: str, compute_type: str, vocab: int, eos_id: int, workloads: list[Workload], warmup: int,
               iters: int, threads: int, tick) -> list[Result]:
    import ctranslate2

    from benchmarks.ct2_convert import _load_vocab

    started = time.perf_counter()
    translator = ctranslate2.Translator(ct2_dir, device="cpu", compute_type=compute_type, intra_threads=threads,
                                        inter_threads=1)
    load_s = time.perf_counter() - started
    names = _load_vocab(ct2_dir, "source")
    results = []
    for w in workloads:
        batch = [[names[i] for i in s] for s in make_sources(vocab, eos_id, w.batch, w.src_len)]

        def run(n: int) -> None:  # min == max length: EOS suppressed, exactly n tokens
            translator.translate_batch(batch, beam_size=w.beam, max_input_length=0, max_decoding_length=n,
                                       min_decoding_length=n)

        # CTranslate2 does not expose its encoder alone: one decoding step stands in for it, which slightly
        # flatters its ms/step.
        results.append(measure(f"ctranslate2 {compute_type}", w, lambda: run(w.new_tokens), lambda: run(1),
                               warmup, iters, tick, load_s))
    for r in results:
        r.peak_rss_mb = peak_rss_mb()
    return results


def seeds_loop(ckpt_dir: str, workloads: list[Workload], warmup: int, iters: int, threads: int, tick) -> list[Result]:
    """The seeds' greedy_decode: encode once, then re-run the decoder over the whole prefix at every step."""
    import torch

    from twostep.model.checkpoint import load_checkpoint
    from twostep.runtime.decoding import pad_batch

    torch.set_num_threads(threads)
    started = time.perf_counter()
    model = load_checkpoint(ckpt_dir).model
    load_s = time.perf_counter() - started
    c = model.config
    results = []
    for w in workloads:
        ids, mask = (torch.from_numpy(a) for a in pad_batch(make_sources(c.src_vocab_size, c.eos_id, w.batch,
                                                                         w.src_len), c.pad_id))

        @torch.inference_mode()
        def request() -> None:
            cross = model.encode(ids, mask)
            ys = torch.full((w.batch, 1), c.bos_id, dtype=torch.long)
            for _ in range(w.new_tokens):
                logits, _ = model.decode_step(ys, mask, model.empty_cache(w.batch), cross)  # no cache
                logits = logits[:, -1]
                logits[:, c.eos_id] = float("-inf")
                ys = torch.cat([ys, logits.argmax(-1, keepdim=True)], dim=1)

        results.append(measure("seeds loop (no cache)", w, request,
                               torch.inference_mode()(lambda: model.encode(ids, mask)), warmup, iters, tick, load_s))
    for r in results:
        r.peak_rss_mb = peak_rss_mb()
    return results


def prepare(work: Path, threads: int, beam: int) -> dict[str, Path]:
    from benchmarks.ct2_convert import check_same_tokens, convert
    from twostep.artifact import load_artifact
    from twostep.artifact.spec import INPLACE
    from twostep.exporter.export import export
    from twostep.model.init import init_checkpoint

    paths = {"ckpt": work / "base", "fp32": work / "base-fp32-inpl", "int8": work / "base-int8-inpl",
             "ct2": work / "base-ct2"}
    if not (paths["ckpt"] / "model.safetensors").is_file():
        console.print("init base checkpoint (random weights, seed 0)")
        init_checkpoint(paths["ckpt"], "base", 32000, seed=0)
    for dtype in ("fp32", "int8"):
        path = paths[dtype]
        if not (path / "manifest.json").is_file() or INPLACE not in load_artifact(path, check_hashes=False).variants:
            console.print(f"export {dtype} (with the in-place decoder)")
            export(paths["ckpt"], path, dtype=dtype, variants=[INPLACE], force=path.exists())
    if not (paths["ct2"] / "model.bin").is_file():
        console.print("convert to CTranslate2")
        convert(paths["ckpt"], paths["ct2"])
    same, total = check_same_tokens(paths["ckpt"], paths["ct2"], n=16, max_new_tokens=64, suppress_eos=True,
                                    threads=threads)
    console.print(f"CTranslate2 float32 vs eager fp32: {same}/{total} greedy sequences identical")
    if same != total:
        raise SystemExit("CTranslate2 conversion does not reproduce eager PyTorch; not timing it")
    if beam > 1:
        same, total = check_same_tokens(paths["ckpt"], paths["ct2"], n=32, max_new_tokens=64, suppress_eos=True,
                                        threads=threads, beam_size=beam)
        console.print(f"CTranslate2 float32 vs eager fp32: {same}/{total} beam-{beam} best hypotheses identical")
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/twostep-bench"))
    p.add_argument("--batch", default="1,32")
    p.add_argument("--src-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--beam", type=int, default=4, help="beam size of the beam workload")
    p.add_argument("--beam-batch", default="32", help="batch sizes of the beam workload (empty: none)")
    p.add_argument("--growth-batch", type=int, default=16, help="batch of the length-growth table (0: none)")
    p.add_argument("--growth-tokens", default="64,512")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--skip", default="", help="comma-separated engines to leave out, e.g. seeds,torch")
    p.add_argument("--json", type=Path, help="write all results here")
    p.add_argument("--markdown", type=Path, help="write the table here")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    paths = prepare(args.work, args.threads, args.beam)
    greedy = [Workload(int(b), args.src_len, args.new_tokens) for b in args.batch.split(",")]
    beams = [Workload(int(b), args.src_len, args.new_tokens, args.beam)
             for b in filter(None, args.beam_batch.split(","))]
    workloads = greedy + beams
    t, w, i = args.threads, args.warmup, args.iters
    engines = {
        "ort-int8": (run_backend, ("ort-cpu", paths["int8"], None, workloads, w, i, t, "cpu")),
        "ort-fp32": (run_backend, ("ort-cpu", paths["fp32"], None, workloads, w, i, t, "cpu")),
        "ort-fp32-concat": (run_backend, ("ort-cpu:concat", paths["fp32"], None, workloads, w, i, t, "cpu")),
        "ct2-fp32": (ct2_engine, (str(paths["ct2"]), "float32", 32000, 3, workloads, w, i, t)),
        "ct2-int8": (ct2_engine, (str(paths["ct2"]), "int8", 32000, 3, workloads, w, i, t)),
        "torch": (run_backend, ("torch", None, paths["ckpt"], workloads, w, i, t, "cpu")),
        "seeds": (seeds_loop, (str(paths["ckpt"]), greedy, 1, 3, t)),  # greedy only: the seeds have no beam
    }
    growth = [Workload(args.growth_batch, args.src_len, int(n)) for n in args.growth_tokens.split(",")]
    if args.growth_batch:
        for key, name in (("growth-inplace", "ort-cpu"), ("growth-concat", "ort-cpu:concat")):
            engines[key] = (run_backend, (name, paths["fp32"], None, growth, 1, 3, t, "cpu"))
    names = {"ort-int8": "twostep ort-cpu int8", "ort-fp32": "twostep ort-cpu fp32",
             "ort-fp32-concat": "twostep ort-cpu fp32, plain decoder", "torch": "twostep torch (eager, KV cache)",
             "growth-inplace": "in-place decoder", "growth-concat": "plain decoder (Concat)"}
    skip = set(filter(None, args.skip.split(",")))
    bandwidth = [memory_bandwidth_gbs(t)]
    results: list[Result] = []
    grown: list[Result] = []  # the growth table's
    with Progress(console=console, transient=True) as progress:
        for key, (target, target_args) in engines.items():
            if key in skip or (key.startswith("growth") and "growth" in skip):
                continue
            warm, its = ((target_args[4], target_args[5]) if target is run_backend
                         else (target_args[-3], target_args[-2]))
            n_ticks = len(target_args[3] if target is run_backend else target_args[-4]) * (warm + its)
            bar = progress.add_task(key, total=n_ticks)
            for r in run_in_child(target, target_args, tick=lambda: progress.advance(bar)):
                r.backend = names.get(key, r.backend)
                (grown if key.startswith("growth") else results).append(r)
    bandwidth.append(memory_bandwidth_gbs(t))
    floors = add_gemm_floors(results, lambda r: floor_graph(r.backend, paths), t)
    weights = {"twostep ort-cpu fp32": weight_bytes_per_step(paths["fp32"] / "decoder_inplace.onnx"),
               "twostep ort-cpu int8": weight_bytes_per_step(paths["int8"] / "decoder_inplace.onnx")}
    weights["twostep ort-cpu fp32, plain decoder"] = weight_bytes_per_step(paths["fp32"] / "decoder.onnx")
    report(results, workloads, grown, growth, bandwidth, weights, floors, args)
    return 0


def floor_graph(engine: str, paths: dict[str, Path]) -> Path:
    """The decoder whose weight products are an engine's GEMM floor: the plain decoder for the plain-decoder
    row, the in-place decoder of the engine's dtype for every other (the same model's products)."""
    if engine.endswith("plain decoder"):
        return paths["fp32"] / "decoder.onnx"
    return paths["int8" if "int8" in engine else "fp32"] / "decoder_inplace.onnx"


def report(results: list[Result], workloads: list[Workload], grown: list[Result], growth: list[Workload],
           bandwidth: list[float], weights: dict[str, int], floors: dict[tuple[Path, int], Floor], args) -> None:
    ref = {r.workload: r for r in results if r.backend == "ctranslate2 float32"}
    gbs = float(np.median(bandwidth))
    lines = ["| engine | workload | ms per decode step | tokens/s | p50 request ms | encoder ms | peak RSS MB | "
             "tokens/s vs CTranslate2 fp32 | batch 1: step / weight-read floor | batched: GEMM floor ms | "
             "GEMM floor GFLOP/s | batched: step / GEMM floor |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    table = Table(title="base model, CPU, EOS suppressed")
    for col in ("engine", "workload", "ms/step", "tokens/s", "p50 ms", "encoder ms", "peak RSS MB", "vs ct2 fp32",
                "vs floor", "GEMM floor ms", "GFLOP/s", "vs GEMM floor"):
        table.add_column(col, justify="left" if col in ("engine", "workload") else "right")
    for w in workloads:
        for r in (r for r in results if r.workload == w):
            ratio = f"{r.tokens_per_s / ref[w].tokens_per_s:.2f}x" if w in ref else "-"
            floor = "-"
            if w.batch == 1 and w.beam == 1 and r.backend in weights:
                floor = f"{r.ms_per_step / (weights[r.backend] / gbs / 1e6):.2f}x"
            gemm = (["-"] * 3 if r.gemm_floor_ms is None else
                    [f"{r.gemm_floor_ms:.2f}", f"{r.gemm_gflops:.1f}", f"{r.step_vs_gemm_floor:.2f}x"])
            row = [r.backend, w.label, f"{r.ms_per_step:.2f}", f"{r.tokens_per_s:,.0f}",
                   f"{r.latency_ms['p50']:.0f}", f"{r.encoder_ms:.1f}", f"{r.peak_rss_mb:,.0f}", ratio, floor, *gemm]
            table.add_row(*row)
            lines.append("| " + " | ".join(row) + " |")
    Console(width=220).print(table)
    lines += ["", f"Memory bandwidth (read, {args.threads} threads, 256 MB): {bandwidth[0]:.1f} GB/s before the "
                  "engines, "
              f"{bandwidth[1]:.1f} after; floors use the median {gbs:.1f} GB/s. Decoder weights read per step: "
              + ", ".join(f"{name.replace('twostep ort-cpu ', '')} {b / 1e6:.1f} MB (floor {b / gbs / 1e6:.2f} ms)"
                          for name, b in weights.items()) + "."]
    console.print(lines[-1])
    for (graph, rows), f in floors.items():
        lines += ["", f"GEMM floor of {graph.parent.name}/{graph.name} at {rows} rows (ONNX Runtime, {args.threads} "
                      f"threads): {f.ms:.2f} ms, {f.flops / 1e9:.2f} GFLOP, {f.gflops:.1f} GFLOP/s; {f.rates()}."]
        console.print(lines[-1])
    by_length = {(r.backend, r.workload.new_tokens): r for r in grown}
    if by_length:
        first, last = growth[0].new_tokens, growth[-1].new_tokens
        lines += ["", f"| fp32, batch {growth[0].batch}, greedy | {first} new tokens: ms/step | {last} new tokens: "
                  f"ms/step | {last} / {first} |", "|---|---:|---:|---:|"]
        for name in ("in-place decoder", "plain decoder (Concat)"):
            if (name, first) in by_length and (name, last) in by_length:
                a, b = by_length[name, first].ms_per_step, by_length[name, last].ms_per_step
                lines.append(f"| {name} | {a:.2f} | {b:.2f} | {b / a:.2f}x |")
                console.print(lines[-1])
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n")
    if args.json:
        meta = {"python": sys.version.split()[0], "machine": platform.processor() or platform.machine(),
                "bandwidth_gbs": bandwidth, "weight_bytes_per_step": weights,
                "gemm_floors": [{"graph": str(graph), "rows": rows, "ms": f.ms, "flops": f.flops, "gflops": f.gflops,
                                 "products": [{**asdict(p), "ms": ms} for p, ms in f.timed]}
                                for (graph, rows), f in floors.items()],
                "args": {k: str(v) for k, v in vars(args).items()}}
        args.json.write_text(json.dumps({"meta": meta, "results": [r.to_dict() for r in results],
                                     "growth": [r.to_dict() for r in grown]}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
