"""Export is a pipeline: build the graphs, validate them, save. It writes into a temporary directory beside
the target and renames it into place only after validation passed; a failed export leaves nothing behind.

The graphs come from the list of graph builders (twostep.artifact.spec.GRAPHS): the contract's encoder and
decoder always, each variant wherever the model allows it (or as asked), its weights shared with the contract
graphs (twostep.exporter.shared). A model past shared.EXTERNAL_DATA_BYTES keeps every graph's weights in one
external data file, each tensor once.

Tracing is most of an export's time and runs in Python, on one core: the graphs are built side by side in
worker processes (twostep.exporter.worker; a small model's, here too), as many as there are graphs, cores and
memory (`jobs`: every process maps the checkpoint's one copy of the weights), while this process records the
eager model's answers; the graphs are validated against that recording once the model is dropped (the weights
are held once at a time: docs/artifact.md, "How a large model is exported within memory").
"""

from __future__ import annotations

import datetime
import gc
import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import torch

import twostep
from twostep import errors
from twostep.artifact import ARTIFACT, Manifest, load_artifact, write_manifest
from twostep.artifact.manifest import GraphEntry
from twostep.artifact.spec import CONTRACT, GRAPHS, GraphInfo, graph_specs
from twostep.errors import BadInput, ParityFailure
from twostep.exporter import shared
from twostep.exporter.graphs import TRACE_SIZES
from twostep.exporter.int4 import quantize_int4
from twostep.exporter.quantize import convert_fp16, fuse_transformer_ops, quantize_int8
from twostep.exporter.validate import (
    EXPORT_GRID,
    TOLERANCE_RULE,
    TOLERANCES,
    ParityReport,
    Recorded,
    check_declaration,
    compare_backend,
    compare_sessions,
    record,
)
from twostep.files import output_directory
from twostep.model.checkpoint import load_checkpoint
from twostep.runtime.backends.ort import KV_CACHES, OrtBackend
from twostep.runtime.backends.torch_backend import TorchBackend
from twostep.runtime.decoding.options import with_defaults

# --dtype -> (graph I/O dtype, weight precision)
DTYPES = {"fp32": ("float32", "fp32"), "fp16": ("float16", "fp16"), "int8": ("float32", "int8"),
          "int4": ("float32", "int4")}
DEFAULT_OPSET = 18


@dataclass
class ExportResult:
    path: Path
    report: ParityReport
    seconds: float


def versions() -> dict[str, str]:
    out = {"twostep": twostep.__version__}
    for package in ("torch", "onnx", "onnxscript", "onnxruntime"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def builder(info: GraphInfo):
    module, function = info.builder.split(":")
    return getattr(importlib.import_module(module), function)


def chosen_variants(config, precision: str, variants: Collection[str] | None) -> list[GraphInfo]:
    """The variants to write: those named (each must suit the model), or (None) every one the model allows."""
    known = [info for info in GRAPHS.values() if info.variant]
    if variants is None:
        return [info for info in known if info.default and not info.unsupported(config, precision)]
    unknown = sorted(set(variants) - {info.name for info in known})
    if unknown:
        raise BadInput(f"unknown graph variant(s) {', '.join(unknown)}; this twostep writes "
                       f"{', '.join(info.name for info in known)}")
    chosen = [info for info in known if info.name in variants]
    for info in chosen:
        reason = info.unsupported(config, precision)
        if reason:
            raise BadInput(f"this model cannot have the {info.name} graph: {reason}")
    return chosen


def build_graph(model: torch.nn.Module, name: str, path: Path, opset: int, optimize: bool,
                precision: str) -> tuple[dict | None, dict | None]:
    """One graph of the artifact, written to `path`: traced in fp32, then fused and converted to fp16 or
    quantized as asked; returns (its fusions, the quantization record)."""
    info = GRAPHS[name]
    torch.manual_seed(0)
    builder(info)(model, path, opset)
    fusions = quantization = None
    if optimize and not info.variant:
        fusions = fuse_transformer_ops(path, model.config.n_heads, model.config.d_model)
    if precision == "fp16":
        quantization = convert_fp16(path)
    if precision == "int8":
        quantization = quantize_int8(path)
    if precision == "int4":
        quantization = quantize_int4(path)
    return fusions, quantization


def store_weights(directory: Path, graphs: list[GraphInfo], once: bool) -> None:
    """Each weight of the graphs in `directory` stored once: all of them in shared.WEIGHTS (`once`: a large model),
    else a variant's in the graph it shares them with."""
    if once:
        shared.store_once([directory / info.file for info in graphs])
        return
    for info in graphs:
        if info.shares:
            shared.share_weights(directory / info.file, directory / GRAPHS[info.shares].file)


def available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def memory_budget(parameter_bytes: int) -> int:
    """What an export may hold at its peak, its workers included: the weights (mapped once for every process
    from the checkpoint's file, then from the artifact's) and 0.3x them plus 1.5 GiB besides."""
    return int(1.3 * parameter_bytes) + (3 << 29)


def default_jobs(graphs: int, parameter_bytes: int, largest_tensor: int) -> int:
    """Processes building the graphs: one a graph, at most one a core, and as many as memory holds, the
    machine's available memory and the export's budget (memory_budget) both. Every process maps the same
    checkpoint file, so the weights count once; a process building a graph holds besides them its trace
    (about 0.5 GiB at MADLAD-400's layer shape) and a weight being transposed as it is written, and the
    process that records the eager model's answers (export.build_graphs) its activations."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    jobs = min(graphs, cores)
    own = 2 * largest_tensor + (1 << 29)
    room = memory_budget(parameter_bytes) - parameter_bytes
    available = available_memory()
    if available is not None:
        room = min(room, available - parameter_bytes)
    return max(1, min(jobs, int(room // own) - 1))


# Bytes a weight of each precision takes, against float32's.
WEIGHT_SHARE = {"fp32": 1.0, "fp16": 0.5, "int8": 0.25, "int4": 0.125}


def disk_needed(parameter_bytes: int, graphs: int, precision: str, jobs: int) -> int:
    """The disk an export takes at its most beside the output: each graph's weights in its own file until they are
    stored once (a graph holds at most the model's weights, in its precision; a graph converted from fp32 is in
    fp32 first, one a process at a time), and the reference's answers for validation (about 1 GiB at a 3B
    model's size)."""
    share = WEIGHT_SHARE[precision]
    converting = jobs if share < 1 else 0
    return int(parameter_bytes * (converting + graphs * share)) + (1 << 30)


def check_disk(out_dir: Path, needed: int) -> None:
    """Refuse, before writing anything, an export the disk cannot hold."""
    where = next((p for p in (out_dir.parent, *out_dir.parents) if p.exists()), Path("."))
    free = shutil.disk_usage(where).free
    if free < needed:
        raise BadInput(f"not enough disk space for the artifact at {out_dir}: the export needs about "
                       f"{needed / 1e9:.1f} GB there while it runs, {free / 1e9:.1f} GB are free")


def build_graphs(model: torch.nn.Module, ckpt_dir: Path, graphs: list[GraphInfo], tmp: Path, opset: int,
                 optimize: bool, precision: str, jobs: int,
                 answers: Path) -> tuple[list[tuple[dict | None, dict | None]], Recorded]:
    """build_graph for each graph, in worker processes (twostep.exporter.worker, which load the checkpoint
    themselves), while this process records the eager model's answers to validation's calls in `answers`
    (validate.record): the graphs are validated against that recording once the model is gone.

    A small model's graphs are shared out among this process and `jobs - 1` workers, the decoders first (they
    take longest). A large one's (past shared.EXTERNAL_DATA_BYTES) are all traced in `jobs` workers: a trace
    leaves parameters held by torch's own caches (torch.export's, out of Python's reach), so the process that
    traced keeps the model's weights mapped until it ends, and this one must drop them before validation. A
    worker's user error is raised here as the same error; a worker's crash as a RuntimeError carrying its
    traceback. Returns each graph's (fusions, quantization) and the recording."""
    order = sorted(graphs, key=lambda info: info.name != "decoder")  # the plain decoder takes longest
    large = shared.parameter_bytes(model) > shared.EXTERNAL_DATA_BYTES
    if large:
        shares, here = [order[i::jobs] for i in range(jobs)], []
    else:
        shares, here = [[info] for info in order[: jobs - 1]], order[jobs - 1 :]
    workers = {}
    try:
        for share in shares:
            call = {"checkpoint": str(ckpt_dir), "graphs": {info.name: str(tmp / info.file) for info in share},
                    "opset": opset, "optimize": optimize, "precision": precision, "parent": os.getpid(),
                    "external_data_bytes": shared.EXTERNAL_DATA_BYTES}
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            process = subprocess.Popen([sys.executable, "-m", "twostep.exporter.worker"], stdin=subprocess.PIPE,
                                       stdout=out, stderr=err, text=True)
            process.stdin.write(json.dumps(call))
            process.stdin.close()
            workers[", ".join(info.name for info in share)] = process, out, err
        results = {info.name: build_graph(model, info.name, tmp / info.file, opset, optimize, precision)
                   for info in here}
        with TorchBackend(model) as eager:
            record(eager, answers, EXPORT_GRID)
        for name, (process, out, err) in workers.items():
            process.wait()
            out.seek(0)
            err.seek(0)
            lines = out.read().splitlines()
            answer = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
            if "error" in answer:
                raise getattr(errors, answer["error"], errors.TwostepError)(answer["message"])
            if process.returncode != 0 or "built" not in answer:
                raise RuntimeError(f"the worker process building {name} failed (exit status {process.returncode}):"
                                   f"\n{err.read()[-4000:]}")
            results.update({graph: (r["fusions"], r["quantization"]) for graph, r in answer["built"].items()})
    finally:
        for process, out, err in workers.values():
            if process.poll() is None:
                process.kill()
                process.wait()
            out.close()
            err.close()
    return [results[info.name] for info in graphs], Recorded(None, answers, model.config, graph_specs(model.config))


def export(ckpt_dir: Path, out_dir: Path, opset: int = DEFAULT_OPSET, dtype: str = "fp32", optimize: bool = False,
           force: bool = False, variants: Collection[str] | None = None, also: Collection[str] = (),
           jobs: int | None = None,
           log=lambda message: None) -> ExportResult:
    """`optimize`: apply ONNX Runtime's transformer fusions to the contract's graphs (ONNX Runtime only:
    TensorRT cannot parse them). `variants`: the variant graphs to write besides the contract's two (e.g.
    ["decoder_inplace"]; [] for none); None writes every default one the model allows
    (decoder_inplace_standard only when named); `also`: variants to write besides those.
    `force`: replace an earlier artifact at `out_dir` (never anything else; see twostep.files).
    `jobs`: processes building the graphs (default_jobs when None)."""
    if dtype not in DTYPES:
        raise BadInput(f"--dtype {dtype!r} is not supported by this exporter; choose one of {', '.join(DTYPES)}")
    if not 17 <= opset <= 23:
        raise BadInput(f"--opset {opset} is outside the supported range 17..23")
    started = time.perf_counter()
    ckpt = load_checkpoint(ckpt_dir)  # its weights memory-mapped, paged in as the trace and the reference read them
    decoding = ckpt.decoding  # the checkpoint's decoding defaults, checked before the long export
    with_defaults(decoding, f"{ckpt_dir}: decoding")
    model = ckpt.model.eval()
    config, task, tokenizer = model.config, ckpt.task, ckpt.tokenizer
    onnx_dtype, precision = DTYPES[dtype]
    chosen = chosen_variants(config, precision, variants)
    chosen += [info for info in chosen_variants(config, precision, also) if info not in chosen]
    graphs = [GRAPHS[name] for name in CONTRACT] + chosen
    out_dir = Path(out_dir)
    parameter_bytes = shared.parameter_bytes(model)
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    jobs = default_jobs(len(graphs), parameter_bytes, largest) if jobs is None else max(1, jobs)
    check_disk(out_dir, disk_needed(parameter_bytes, len(graphs), precision, jobs))
    with output_directory(out_dir, ARTIFACT, force) as tmp, \
            tempfile.TemporaryDirectory(prefix=".validation-", dir=tmp.parent) as answers:
        steps = ", ".join(filter(None, ["traced", "fused" if optimize else "",
                                        {"fp16": "converted to fp16", "int8": "quantized to int8",
                                         "int4": "quantized to int4"}.get(precision)]))
        log(f"exporting {', '.join(info.name for info in graphs)} ({steps}) in {jobs} process(es)")
        built, reference = build_graphs(model, ckpt.path, graphs, tmp, opset, optimize, precision, jobs,
                                         Path(answers))
        del model, ckpt  # the eager model's part is done (its answers are kept): its weights leave memory
        gc.collect()
        fusions = {info.name: f for info, (f, _) in zip(graphs, built) if f is not None}
        quantization = built[-1][1]
        once = parameter_bytes > shared.EXTERNAL_DATA_BYTES
        if once:
            log(f"storing the weights once, in {shared.WEIGHTS}")
        store_weights(tmp, graphs, once)
        for name in tokenizer.files() if tokenizer else []:
            shutil.copyfile(Path(ckpt_dir) / name, tmp / name)
        entries = {info.name: GraphEntry(info.name, info.file, info.spec(config, onnx_dtype), info.runtime,
                                         info.ops) for info in graphs}
        problems = [p for entry in entries.values() for p in check_declaration(tmp / entry.file, entry.spec)]
        if problems:
            raise ParityFailure("exported graphs do not match their declaration:\n  " + "\n  ".join(problems))
        manifest = Manifest(
            config=config, dtype=onnx_dtype, precision=precision, opset=opset, graphs=entries,
            tokenizer=tokenizer, task=task, decoding=decoding,
            quantization=quantization, fusions=fusions if optimize else None,
            exporter={"versions": versions(), "trace_sizes": TRACE_SIZES,
                      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
        )
        write_manifest(tmp, manifest)
        log("validating against eager PyTorch on the export's shape grid")
        # ONNX Runtime maps the weights (page-aligned external data) and, prepacking off, copies none of them:
        # the sessions side by side hold the weights once.
        with OrtBackend(load_artifact(tmp), prepack=False) as candidate:
            report = compare_backend(candidate, reference, precision, EXPORT_GRID)  # with the decoder it decodes with
            for kv_cache, decoder in KV_CACHES.items():  # and each other variant decoder, step by step
                if decoder in entries and decoder not in (candidate.decoder, "decoder"):
                    with OrtBackend(load_artifact(tmp), kv_cache=kv_cache, prepack=False) as other:
                        compare_sessions(other, reference, precision, report, grid=EXPORT_GRID)
        if not report.ok:
            raise ParityFailure(f"{len(report.failures)} parity failure(s) after export:\n  "
                                + "\n  ".join(report.failures[:50]))
        write_manifest(tmp, manifest.replace(validation={
            "tolerances": TOLERANCES[precision], "tolerance_rule": TOLERANCE_RULE, "shape_grid": EXPORT_GRID.to_dict(),
            "cases": report.cases, "max_error": report.max_error}))
    return ExportResult(out_dir, report, time.perf_counter() - started)
