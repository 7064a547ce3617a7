"""Export is a pipeline: build both graphs, validate them, save. It writes into a temporary directory beside
the target and renames it into place only after validation passed; a failed export leaves nothing behind.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import twostep
from twostep.artifact import ARTIFACT, FORMAT, GRAPH_FILES, SCHEMA_VERSION, load_artifact, write_manifest
from twostep.errors import BadInput, ParityFailure
from twostep.files import output_directory
from twostep.exporter.graphs import TRACE_SIZES, export_graph
from twostep.exporter.quantize import convert_fp16, fuse_transformer_ops, quantize_int8
from twostep.exporter.spec import INPLACE, INPLACE_FILE, INPLACE_OPS, graph_specs, inplace_spec, inplace_unsupported
from twostep.exporter.validate import SHAPE_GRID, TOLERANCES, ParityReport, check_declaration, compare_backend
from twostep.model.checkpoint import load_checkpoint
from twostep.runtime.backends.ort import OrtBackend
from twostep.runtime.backends.torch_backend import TorchBackend

# --dtype -> (graph I/O dtype, weight precision)
DTYPES = {"fp32": ("float32", "fp32"), "fp16": ("float16", "fp16"), "int8": ("float32", "int8")}
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


def export(ckpt_dir: Path, out_dir: Path, opset: int = DEFAULT_OPSET, dtype: str = "fp32", optimize: bool = False,
           force: bool = False, inplace_cache: bool = False, log=lambda message: None) -> ExportResult:
    """`optimize`: apply ONNX Runtime's transformer fusions (ONNX Runtime only: TensorRT cannot parse them).
    `inplace_cache`: add the in-place decoder, an ONNX Runtime (CPU) variant whose cache is written in place
    (twostep.exporter.inplace); the two plain graphs are exported as always.
    `force`: replace an earlier artifact at `out_dir` (never anything else; see twostep.files)."""
    if dtype not in DTYPES:
        raise BadInput(f"--dtype {dtype!r} is not supported by this exporter; choose one of {', '.join(DTYPES)}")
    if not 17 <= opset <= 23:
        raise BadInput(f"--opset {opset} is outside the supported range 17..23")
    if inplace_cache and dtype == "fp16":
        raise BadInput("--inplace-cache is for ONNX Runtime on the CPU (fp32 or int8); fp16 artifacts run on GPUs")
    started = time.perf_counter()
    ckpt = load_checkpoint(ckpt_dir)
    model = ckpt.model.eval()
    reason = inplace_unsupported(model.config) if inplace_cache else None
    if reason:
        raise BadInput(f"--inplace-cache: this model cannot have the in-place decoder: {reason}")
    onnx_dtype, precision = DTYPES[dtype]
    specs = graph_specs(model.config, onnx_dtype)
    out_dir = Path(out_dir)
    with output_directory(out_dir, ARTIFACT, force) as tmp:
        torch.manual_seed(0)
        quantization, fusions = None, {}
        for graph, spec in specs.items():
            log(f"exporting {graph}")
            path = tmp / GRAPH_FILES[graph]
            export_graph(model, graph, graph_specs(model.config)[graph], path, opset)  # traced in fp32
            if optimize:
                log(f"fusing {graph}")
                fusions[graph] = fuse_transformer_ops(path, model.config.n_heads, model.config.d_model)
            if precision == "fp16":
                log(f"converting {graph} to fp16")
                quantization = convert_fp16(path)
            if precision == "int8":
                log(f"quantizing {graph} to int8")
                quantization = quantize_int8(path)
        variants = {}
        if inplace_cache:
            from twostep.exporter.inplace import export_inplace

            log("exporting the in-place decoder")
            path = tmp / INPLACE_FILE
            export_inplace(model, path, opset)
            if precision == "int8":
                quantize_int8(path)
            variants[INPLACE] = {"file": INPLACE_FILE, **inplace_spec(model.config, onnx_dtype).to_dict(),
                                 "runtime": "onnxruntime", "ops": INPLACE_OPS}
        if ckpt.tokenizer_path is not None:
            shutil.copyfile(ckpt.tokenizer_path, tmp / "tokenizer.model")
        problems = [p for graph, spec in specs.items() for p in check_declaration(tmp / GRAPH_FILES[graph], spec)]
        if inplace_cache:
            problems += check_declaration(tmp / INPLACE_FILE, inplace_spec(model.config, onnx_dtype))
        if problems:
            raise ParityFailure("exported graphs do not match their declaration:\n  " + "\n  ".join(problems))
        c = model.config
        manifest = {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "model": c.to_dict(),
            "special_tokens": {"pad": c.pad_id, "unk": c.unk_id, "bos": c.bos_id, "eos": c.eos_id},
            "source_suffix": "eos",  # source token ids end with eos; decoding starts from bos
            "max_positions": c.max_positions,
            "dtype": onnx_dtype,
            "precision": precision,
            "quantization": quantization,
            "fusions": fusions if optimize else None,  # com.microsoft ops: ONNX Runtime only
            "opset": opset,
            "graphs": {g: {"file": GRAPH_FILES[g], **spec.to_dict()} for g, spec in specs.items()},
            "variants": variants,  # runtime-specific graphs beside the two (ONNX Runtime's in-place decoder)
            "tokenizer": "tokenizer.model" if ckpt.tokenizer_path is not None else None,
            "task": ckpt.task,
            "exporter": {"versions": versions(), "trace_sizes": TRACE_SIZES,
                         "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
        }
        write_manifest(tmp, manifest)
        log("validating against eager PyTorch on the shape grid")
        with OrtBackend(load_artifact(tmp)) as candidate, TorchBackend(model) as reference:
            report = compare_backend(candidate, reference, precision)  # with the in-place decoder, if any
        if not report.ok:
            raise ParityFailure(f"{len(report.failures)} parity failure(s) after export:\n  "
                                + "\n  ".join(report.failures[:50]))
        manifest["validation"] = {"tolerances": TOLERANCES[precision], "shape_grid": SHAPE_GRID,
                                  "cases": report.cases, "max_error": report.max_error}
        write_manifest(tmp, manifest)
    return ExportResult(out_dir, report, time.perf_counter() - started)
