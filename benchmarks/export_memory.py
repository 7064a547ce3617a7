"""The memory and time each engine takes to turn a transformers directory of a 3B model into what it decodes:
the peak, over the conversion, of the resident memory of its whole process tree (PSS, workers included:
benchmarks/memory.py), wall time and output bytes, against twostep's budget, 1.3x the parameters' bytes plus
1.5 GiB (twostep.exporter.export.memory_budget).

    python -m benchmarks.export_memory [--shape madlad-3b|nllb-3.3b|smoke] [--work DIR]
                                       [--engines twostep-fp32,twostep-int8,ct2-fp32,ct2-int8,optimum]
                                       [--optimum-python PY] [--limit-gib G] [--keep] [--drop-hf]
                                       [--json OUT] [--markdown OUT]

The models, random weights saved by transformers itself (`save_pretrained`), at the sizes of the two 3B
many-language models:

- madlad-3b: a T5 (MT5 classes) of MADLAD-400-3B's shape: 32+32 layers, d_model 1024, 16 heads of 128, d_ff
  8192 gated-gelu, a vocabulary of 256,000, its own output layer (benchmarks/t5.py's build_hf_model).
- nllb-3.3b: an M2M100 of NLLB-200-3.3B's shape: 24+24 layers, d_model 2048, 16 heads, d_ff 8192, a vocabulary
  of 256,206, the output layer tied to the shared embedding (NLLB's). The engines take the weights; the
  tokenizer is a made-up NLLB one (benchmarks/marian.py's builder is not used: its training is for small models).

Each conversion is the command a user runs, in a fresh process: `twostep import` (its own row), then `twostep
export --dtype fp32|int8` (validated against eager PyTorch, as by default); `ct2-transformers-converter
[--quantization int8]`; Optimum's export (`--optimum-python`, see benchmarks/marian.py). A conversion that
fails is reported with its peak until then; one whose tree passes `--limit-gib` of PSS is killed there
(before the machine runs out and the kernel picks a victim) and reported so. One at a time, nothing else running.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.export_time import commands, output_bytes, parameter_count
from benchmarks.marian import cpu_model, twostep_cli
from benchmarks.memory import GIB, measure
from twostep.exporter.export import memory_budget

ENGINES = ("twostep-fp32", "twostep-int8", "ct2-fp32", "ct2-int8", "optimum")


@dataclass(frozen=True)
class Shape:
    name: str
    family: str  # t5 | m2m100
    layers: int
    d_model: int
    heads: int
    d_kv: int
    d_ff: int
    vocab: int


SHAPES = {
    "madlad-3b": Shape("madlad-3b", "t5", 32, 1024, 16, 128, 8192, 256000),
    "nllb-3.3b": Shape("nllb-3.3b", "m2m100", 24, 2048, 16, 128, 8192, 256206),
    "smoke": Shape("smoke", "t5", 1, 32, 4, 8, 64, 312),
}


def build(shape: Shape, out: Path) -> Path:
    """The transformers directory of `shape`, random weights (seed 0), written by save_pretrained."""
    if out.is_dir():
        return out
    if shape.family == "t5":
        from benchmarks.t5 import Size, build_hf_model

        return build_hf_model(out, Size(shape.name, shape.vocab, shape.vocab - 100 - 100, shape.d_model, shape.d_kv,
                                        shape.heads, shape.layers, shape.d_ff))
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    torch.manual_seed(0)
    config = M2M100Config(vocab_size=shape.vocab, d_model=shape.d_model, encoder_layers=shape.layers,
                          decoder_layers=shape.layers, encoder_attention_heads=shape.heads,
                          decoder_attention_heads=shape.heads, encoder_ffn_dim=shape.d_ff, decoder_ffn_dim=shape.d_ff,
                          max_position_embeddings=1024, scale_embedding=True, pad_token_id=1, bos_token_id=0,
                          eos_token_id=2, decoder_start_token_id=2)
    model = M2M100ForConditionalGeneration(config).eval()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    del model
    write_nllb_tokenizer(tmp, shape.vocab)
    tmp.rename(out)
    return out


def write_nllb_tokenizer(path: Path, rows: int) -> None:
    """A tokenizer.json of NLLB's layout (a BPE of made-up pieces, <s> <pad> </s> <unk> first, language codes as
    added tokens at the end) numbering `rows` ids, and its tokenizer_config.json."""
    codes = ["eng_Latn", "fra_Latn", "deu_Latn", "por_Latn"]
    pieces = rows - 4 - len(codes)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3} | {f"\u2581t{i}": 4 + i for i in range(pieces)}
    added = [{"id": i, "content": c, "special": True, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False} for i, c in enumerate(["<s>", "<pad>", "</s>", "<unk>"])]
    added += [{"id": 4 + pieces + i, "content": c, "special": True, "single_word": False, "lstrip": False,
               "rstrip": False, "normalized": False} for i, c in enumerate(codes)]
    tokenizer = {"version": "1.0", "added_tokens": added, "normalizer": None,
                 "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                                   "split": True},
                 "model": {"type": "BPE", "vocab": vocab, "merges": [], "unk_token": "<unk>"}}
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = {"tokenizer_class": "NllbTokenizer", "src_lang": "eng_Latn"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))


def run(name: str, command: list[str], out: Path | None, work: Path, log, limit: int | None = None) -> dict:
    log(f"{name}: {' '.join(command)}")
    with open(work / f"{name}.log", "w") as sink:
        peak = measure(command, interval=0.5, stdout=sink, stderr=subprocess.STDOUT, limit=limit)
    log(f"{name}: {peak.describe()}")
    return {"pss": peak.pss, "rss": peak.rss, "seconds": peak.seconds, "returncode": peak.returncode,
            "processes": peak.processes, "stopped": peak.stopped, "bytes": output_bytes(out) if out else None}


def report(result: dict) -> str:
    budget = result["budget"]
    lines = [f"{result['shape']}: {result['parameter_bytes']:,} bytes of fp32 parameters; budget 1.3x + 1.5 GiB = "
             f"{budget / GIB:.2f} GiB. CPU {result['cpu']}, {result['date']}.", "",
             "| conversion | peak PSS GiB | / budget | peak RSS GiB | s | output bytes | exit |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, row in result["rows"].items():
        exit_ = "killed past the limit" if row.get("stopped") else row["returncode"]
        lines.append(f"| {name} | {row['pss'] / GIB:.2f} | {row['pss'] / budget:.2f} | {row['rss'] / GIB:.2f} | "
                     f"{row['seconds']:.0f} | {row['bytes'] or 0:,} | {exit_} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=SHAPES, default="madlad-3b")
    p.add_argument("--work", type=Path, default=Path("/tmp/twostep-export-memory"))
    p.add_argument("--engines", default="twostep-fp32,twostep-int8,ct2-fp32,ct2-int8")
    p.add_argument("--optimum-python")
    p.add_argument("--limit-gib", type=float, default=21.0,
                   help="a conversion whose tree passes this PSS is killed and reported so (default: 21 of 24 GiB)")
    p.add_argument("--keep", action="store_true", help="keep each engine's output (default: removed after it)")
    p.add_argument("--drop-hf", action="store_true", help="remove the transformers files once nothing reads them "
                   "(the engines converting them run first): a 3B shape's four copies need 55 GB of disk, this 40")
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)
    shape, work = SHAPES[args.shape], args.work / args.shape
    work.mkdir(parents=True, exist_ok=True)
    engines = [e for e in args.engines.split(",") if e]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        p.error(f"unknown engines {unknown}; choose from {', '.join(ENGINES)}")

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    paths = {"hf": build(shape, work / "hf"), "ckpt": work / "ckpt"} | {engine: work / engine for engine in engines}
    params = 4 * parameter_count(paths["hf"])
    importing = twostep_cli("import", paths["hf"], "--out", paths["ckpt"], "--force")
    rows = {"twostep import": run("twostep-import", importing, None, work, log)}

    def convert(engine: str) -> None:
        if engine == "optimum" and not args.optimum_python:
            log("optimum: no --optimum-python, skipped")
            return
        out = paths[engine]
        shutil.rmtree(out, ignore_errors=True)
        rows[engine] = run(engine, commands(engine, paths, args.optimum_python)[0], out, work, log,
                           int(args.limit_gib * GIB))
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)

    for engine in [e for e in engines if not e.startswith("twostep")]:  # those converting the transformers files
        convert(engine)
    if args.drop_hf:
        shutil.rmtree(paths["hf"])
    for engine in [e for e in engines if e.startswith("twostep")]:
        convert(engine)
    result = {"shape": shape.name, "parameter_bytes": params, "budget": memory_budget(params), "cpu": cpu_model(),
              "date": time.strftime("%Y-%m-%d"), "rows": rows}
    text = report(result)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(text)
    return 0 if all(row["returncode"] == 0 for name, row in rows.items() if name.startswith("twostep")) else 1


if __name__ == "__main__":
    sys.exit(main())
