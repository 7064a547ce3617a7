"""How long each engine takes to turn a transformers directory into what it decodes, side by side in one run:
benchmarks/marian.py's models (`--family marian`: OPUS-MT's size; `nllb`: NLLB-200-distilled-600M's).

    python -m benchmarks.export_time [--family marian|nllb] [--work DIR] [--iters 1] [--tiny]
                                     [--engines twostep-fp32,twostep-int8,ct2-fp32,ct2-int8,optimum]
                                     [--optimum-python PY] [--json OUT] [--markdown OUT]

Each conversion is the command a user runs, in a fresh process, timed from start to exit (wall clock):

- twostep: `twostep import HF_DIR` (timed once per iteration, as "twostep import"), then `twostep export CKPT`
  (fp32; int8: `--dtype int8`), the default export: the encoder, the decoder and the in-place decoder,
  validated against eager PyTorch on the export's shape grid. "twostep fp32 total" is import + export.
- CTranslate2: `ct2-transformers-converter --model HF_DIR --output_dir OUT [--quantization int8]`.
- Optimum: `ORTModelForSeq2SeqLM.from_pretrained(HF_DIR, export=True).save_pretrained(OUT)` under the
  Optimum interpreter (benchmarks/marian.py's `--optimum-export`, see its docstring).

Engines run one after the other, interleaved over --iters (A, B, C, A, B, C, ...); each writes where
benchmarks/marian.py reads it under --work (the last iteration's output stays, so a timed run of marian.py after
this one skips its preparation). Reported: median seconds, the output's bytes on disk and their ratio to the
model's parameter bytes (fp32 for every engine's fp32, the int8 output against the same fp32 bytes), and the
ratios the issue sets as targets: twostep fp32 total <= 2x Optimum on the Marian model, <= 1.2x at NLLB's size.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.marian import FAMILIES, LABELS, MARIAN, cpu_model, find_optimum_python, load_average, twostep_cli

ENGINES = ("twostep-fp32", "twostep-int8", "ct2-fp32", "ct2-int8", "optimum")
TARGET = {"marian": 2.0, "nllb": 1.2}  # twostep fp32 total / Optimum, at most


def output_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def commands(engine: str, paths: dict, optimum_python: str | None) -> list[list[str]]:
    hf, ckpt, out = paths["hf"], paths["ckpt"], paths[engine]
    if engine.startswith("twostep"):
        dtype = engine.split("-")[1]
        return [twostep_cli("export", ckpt, "--out", out, "--dtype", dtype, "--force")]
    if engine.startswith("ct2"):
        converter = Path(sys.executable).with_name("ct2-transformers-converter")
        quantization = ["--quantization", "int8"] if engine == "ct2-int8" else []
        return [[str(converter), "--model", str(hf), "--output_dir", str(out), *quantization, "--force"]]
    return [[optimum_python, "-m", "benchmarks.marian", "--optimum-export", str(hf), str(out)]]


def timed(cmd: list[str], log_path: Path) -> float:
    import subprocess

    started = time.perf_counter()
    with open(log_path, "a") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[1])
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd[:4]))} ... failed (exit {proc.returncode}); see {log_path}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=sorted(FAMILIES), default="marian")
    p.add_argument("--work", type=Path, help="the models are built here (as benchmarks/marian.py builds them)")
    p.add_argument("--tiny", action="store_true", help="the tiny model: the smoke test's")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    p.add_argument("--iters", type=int, default=1)
    p.add_argument("--optimum-python", help="interpreter with optimum-onnx for the Optimum engine")
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)

    family, build = FAMILIES[args.family]
    size = family.tiny if args.tiny else family.base
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if set(engines) - set(ENGINES):
        p.error(f"unknown engines {sorted(set(engines) - set(ENGINES))}; choose from {', '.join(ENGINES)}")

    def log(msg: str) -> None:
        print(f"[export-time {family.name} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    work = args.work or Path(tempfile.mkdtemp(prefix=f"twostep-export-{family.name}-"))
    work = work / (size.name if family is MARIAN else f"{family.name}-{size.name}")  # as marian.py's
    (work / "logs").mkdir(parents=True, exist_ok=True)
    paths = {"hf": work / "hf", "ckpt": work / "twostep-ckpt", "twostep-fp32": work / "twostep-fp32",
             "twostep-int8": work / "twostep-int8", "ct2-fp32": work / "ct2-fp32", "ct2-int8": work / "ct2-int8",
             "optimum": work / "optimum-onnx"}
    if not (paths["hf"] / "model.safetensors").is_file():
        log(f"building the random {size.name} {family.name} model in {paths['hf']}")
        build(paths["hf"], size)
    parameter_bytes = 4 * parameter_count(paths["hf"])
    optimum_python = find_optimum_python(args.optimum_python) if "optimum" in engines else None
    errors: dict[str, str] = {}
    if "optimum" in engines and optimum_python is None:
        errors["optimum"] = "no interpreter with optimum-onnx (see benchmarks/marian.py)"
    if any(e.startswith("ct2") for e in engines) and not Path(sys.executable).with_name(
            "ct2-transformers-converter").is_file():
        errors.update({e: "ctranslate2 is not installed; pip install -e '.[bench]'" for e in engines
                       if e.startswith("ct2")})
    runnable = [e for e in engines if e not in errors]

    seconds: dict[str, list[float]] = {e: [] for e in runnable}
    if any(e.startswith("twostep") for e in runnable):
        seconds["twostep-import"] = []
    load_before = load_average()
    for i in range(args.iters):
        for e in runnable:
            if e.startswith("twostep") and len(seconds["twostep-import"]) <= i:
                log(f"run {i + 1}/{args.iters}: twostep import")
                cmd = twostep_cli("import", paths["hf"], "--out", paths["ckpt"], "--force")
                seconds["twostep-import"].append(timed(cmd, work / "logs" / "import.log"))
            log(f"run {i + 1}/{args.iters}: {e}")
            if e == "optimum":  # Optimum's export writes into a fresh directory (marian.py's optimum_export)
                shutil.rmtree(paths[e], ignore_errors=True)
            try:
                for cmd in commands(e, paths, optimum_python):
                    seconds[e].append(timed(cmd, work / "logs" / f"export-{e}.log"))
            except RuntimeError as exc:
                errors[e] = str(exc)
                runnable.remove(e)
                del seconds[e]
    load_after = load_average()

    rows = []
    for e, values in seconds.items():
        rows.append({"engine": e, "seconds": values, "median_s": statistics.median(values),
                     "bytes": None if e == "twostep-import" else output_bytes(paths[e])})
    median = {r["engine"]: r["median_s"] for r in rows}
    if "twostep-fp32" in median:
        median["twostep-fp32-total"] = median["twostep-import"] + median["twostep-fp32"]
    ratio = (median["twostep-fp32-total"] / median["optimum"]
             if "twostep-fp32-total" in median and "optimum" in median else None)
    meta = {"family": family.name, "size": size.name, "cpu": cpu_model(), "iters": args.iters,
            "date": time.strftime("%Y-%m-%d %H:%M"), "parameter_bytes": parameter_bytes,
            "load_average": {"before": load_before, "after": load_after}}
    result = {"meta": meta, "rows": rows, "errors": errors, "twostep_fp32_total_s": median.get("twostep-fp32-total"),
              "ratio_to_optimum": ratio, "target": TARGET[family.name]}
    table = report(result)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.markdown:
        args.markdown.write_text(table + "\n")
    return 0


def parameter_count(hf_dir: Path) -> int:
    """Parameters in the safetensors file (its header's shapes; tied tensors are stored once)."""
    import struct

    with open(hf_dir / "model.safetensors", "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    count = 0
    for name, entry in header.items():
        if name != "__metadata__":
            n = 1
            for d in entry["shape"]:
                n *= d
            count += n
    return count


def report(result: dict) -> str:
    meta = result["meta"]
    names = {**LABELS, "twostep-import": "twostep import"}
    load = meta["load_average"]
    lines = [f"CPU: {meta['cpu']}; {meta['family']} {meta['size']}; medians of {meta['iters']} run(s); "
             f"{meta['date']}; load average before/after {load['before']}/{load['after']}; "
             f"parameters {meta['parameter_bytes']:,} bytes in fp32", "",
             "| conversion | median s | min-max s | output bytes | / fp32 parameter bytes |",
             "|---|---:|---:|---:|---:|"]
    for r in result["rows"]:
        size = "" if r["bytes"] is None else f"{r['bytes']:,}"
        share = "" if r["bytes"] is None else f"{r['bytes'] / meta['parameter_bytes']:.2f}"
        spread = f"{min(r['seconds']):.1f}-{max(r['seconds']):.1f}"
        lines.append(f"| {names[r['engine']]} | {r['median_s']:.1f} | {spread} | {size} | {share} |")
    for e, why in result["errors"].items():
        lines.append(f"| {names[e]} | not run: {why.splitlines()[0][:200]} | | | |")
    if result["ratio_to_optimum"] is not None:
        met = result["ratio_to_optimum"] <= result["target"]
        lines += ["", f"twostep fp32 import + export: {result['twostep_fp32_total_s']:.1f} s, "
                  f"{result['ratio_to_optimum']:.2f}x Optimum's export (target at most {result['target']:.1f}x: "
                  f"{'met' if met else 'NOT met'})"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
