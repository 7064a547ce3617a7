"""The `twostep` command: a thin typer shell. Each command parses, calls one library function, prints, exits.

User errors (`TwostepError`) print one line to stderr and exit 1; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from twostep.errors import BadInput, TwostepError
from twostep.runtime.backends.profile import DEFAULT_ROWS
from twostep.runtime.files import FORMATS as FILE_FORMATS
from twostep.serving.limits import BATCHING, BatchLimits

DEFAULTS = "Default: the model's (its manifest's decoding section), else twostep's."

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Deploy PyTorch encoder-decoder Transformers as two ONNX graphs with a KV cache.")
# Piped output is read by programs and tests: no 80-column wrapping there.
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, soft_wrap=True, width=None if sys.stderr.isatty() else 200)


def parse_ids(lines: list[str]) -> list[list[int]]:
    out = []
    for i, line in enumerate(lines):
        try:
            out.append([int(token) for token in line.split()])
        except ValueError:
            raise TwostepError(f"sentence {i + 1}: {line[:40]!r} is not a list of token ids (--ids)") from None
    return out


def emit_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


@app.command()
def train(
    out_dir: Path = typer.Option(..., "--out", help="Checkpoint directory to write."),
    task: str = typer.Option("numbers-en-de", help="Bundled task to train on."),
    preset: str = typer.Option("demo", help="Model size preset: tiny, demo, base."),
    steps: int = typer.Option(2400, min=1),
    max_tokens: int = typer.Option(3000, min=16, help="Target tokens per batch, padding included."),
    warmup: int = typer.Option(400, min=1),
    lr_factor: float = typer.Option(0.8, min=0.0),
    vocab_size: int = typer.Option(256, min=16),
    eval_every: int = typer.Option(300, min=1),
    seed: int = typer.Option(1),
    threads: int = typer.Option(2, min=1),
    resume: bool = typer.Option(False, help="Continue from OUT.train/ if an earlier run left it."),
    force: bool = typer.Option(False, "--force",
                               help="Replace an earlier checkpoint at --out, or start over from an earlier run's "
                               "state."),
) -> None:
    """Train a model on a bundled task with the seeds' recipe (Noam, label smoothing, length batches)."""
    from twostep.training.train import TrainConfig
    from twostep.training.train import train as run_train

    cfg = TrainConfig(task=task, preset=preset, steps=steps, max_tokens=max_tokens, warmup=warmup,
                      lr_factor=lr_factor, vocab_size=vocab_size, eval_every=eval_every, seed=seed, threads=threads)
    command = "twostep " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    scores = run_train(cfg, out_dir, resume=resume, force=force, command=command, log=out.print)
    out.print(f"wrote {out_dir} (dev exact match {scores.exact_match:.1f}%)")


@app.command()
def evaluate(
    ckpt_dir: Path = typer.Argument(..., help="Checkpoint directory."),
    split: str = typer.Option("test", help="train, dev or test."),
    limit: Optional[int] = typer.Option(None, min=1, help="Only the first N sentences."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Exact match and BLEU of greedy decoding in eager PyTorch on a split of the checkpoint's task."""
    from twostep.model.checkpoint import load_checkpoint
    from twostep.training.evaluate import checkpoint_translator
    from twostep.training.evaluate import evaluate as run_evaluate

    ckpt = load_checkpoint(ckpt_dir)
    if ckpt.task is None:
        raise TwostepError(f"{ckpt_dir}: the checkpoint names no task; evaluate needs one of the bundled tasks")
    scores = run_evaluate(checkpoint_translator(ckpt), ckpt.task, split, limit)
    if as_json:
        emit_json(scores.to_dict())
    else:
        out.print(f"{scores.task} {scores.split}: {scores.sentences} sentences, exact match "
                  f"{scores.exact_match:.2f}%, BLEU {scores.bleu:.2f}, chrF {scores.chrf:.2f}")


@app.command()
def translate(
    model_dir: Path = typer.Argument(..., help="Artifact directory (any backend) or checkpoint (torch)."),
    text: Optional[list[str]] = typer.Argument(None, help="Texts to translate; when omitted, stdin is one text (with "
                                               "--no-split or --ids: one sentence a line)."),
    backend: Optional[str] = typer.Option(None, help="torch, ort-cpu, ort-cuda; default ort-cpu for artifacts."),
    checkpoint: Optional[Path] = typer.Option(None, help="Checkpoint, for --backend torch on an artifact."),
    beam: Optional[int] = typer.Option(None, min=1, show_default=False, help=f"Beam size; 1 is greedy. {DEFAULTS}"),
    n_best: Optional[int] = typer.Option(None, min=1, show_default=False, help="Hypotheses per sentence (with "
                                         f"--beam). {DEFAULTS}"),
    length_penalty: Optional[float] = typer.Option(None, show_default=False, help="Beam scores: log-probability / "
                                                   f"length ** this. {DEFAULTS}"),
    sample: Optional[bool] = typer.Option(None, "--sample/--no-sample", show_default=False,
                                          help=f"Sample instead of searching. {DEFAULTS}"),
    temperature: Optional[float] = typer.Option(None, show_default=False),
    top_k: Optional[int] = typer.Option(None, min=0, show_default=False),
    top_p: Optional[float] = typer.Option(None, show_default=False),
    seed: Optional[int] = typer.Option(None),
    max_new_tokens: Optional[int] = typer.Option(None, min=1, show_default=False,
                                                 help=f"Default: 2 x source length + 16. {DEFAULTS}"),
    min_new_tokens: Optional[int] = typer.Option(None, min=0, show_default=False,
                                                 help=f"No eos before this many tokens. {DEFAULTS}"),
    replace_unknowns: Optional[bool] = typer.Option(
        None, "--replace-unknowns/--keep-unknowns", show_default=False,
        help=f"Replace each <unk> by the source piece it attends to most (CTranslate2's). {DEFAULTS}"),
    threads: Optional[int] = typer.Option(None, min=1, help="Intra-op threads (default: the library's)."),
    device: str = typer.Option("cpu", help="torch backend only: cpu or cuda."),
    ids: bool = typer.Option(False, "--ids", help="Input and output are token ids separated by spaces."),
    as_json: bool = typer.Option(False, "--json"),
    src_lang: Optional[str] = typer.Option(None, help="Source language of a multilingual model (M2M100: en; "
                                           "NLLB: eng_Latn; mBART-50: en_XX); also the rules that split texts "
                                           "into sentences (English's without it)."),
    tgt_lang: Optional[str] = typer.Option(None, help="Target language (M2M100: fr; NLLB: fra_Latn; mBART-50: "
                                           "fr_XX; multilingual Marian: fra)."),
    beam_stop: Optional[str] = typer.Option(None, show_default=False, help=(
        "Beam search's stopping rule: n_best (twostep's), transformers (its generate()'s: keeps --beam finished "
        "hypotheses, may run longer; transformers_early and transformers_never: with early_stopping true and "
        "\"never\"), or ctranslate2 (CTranslate2's beam search, as Argos Translate decodes). "
        f"{DEFAULTS}")),
    no_repeat_ngram_size: Optional[int] = typer.Option(None, min=0, show_default=False, help=(
        "Never repeat an n-gram of this size (transformers' no_repeat_ngram_size; 0: no such rule). "
        f"{DEFAULTS}")),
    split: bool = typer.Option(True, "--split/--no-split", help=(
        "Translate each text sentence by sentence, keeping the spaces, line breaks and paragraphs between "
        "sentences (--n-best: a text of several sentences gets one translation, its sentences' best). "
        "--no-split: each text is one sentence.")),
    file: Optional[Path] = typer.Option(None, "--file", help="Translate this file into --out instead of texts, "
                                        "its formatting kept: " + ", ".join(FILE_FORMATS) + " (as LibreTranslate's "
                                        "POST /translate_file)."),
    out: Optional[Path] = typer.Option(None, "--out", help="--file: where the translated file goes."),
    glossary: Optional[Path] = typer.Option(None, "--glossary", help=(
        "Terms the translation must use: a file of lines 'source term<TAB>target term' (.csv: comma-separated), "
        "further fields further target variants (any one of them). A sentence in which a term is found is "
        "searched with constrained beam search (at least beam 4); one translation per text; terms not applied "
        "are reported on stderr (--json: applied_terms, unmet_terms).")),
    glossary_ignore_case: bool = typer.Option(False, "--glossary-ignore-case",
                                              help="Find the glossary's source terms whatever their case."),
) -> None:
    """Translate texts with any backend: each text is split into sentences (--no-split: it is one sentence); or a
    file (--file, --out)."""
    from twostep.runtime.translator import open_translator

    if file is not None:
        if text or ids:
            raise TwostepError("--file translates a file: give no texts and no --ids with it")
        if out is None:
            raise TwostepError("--file needs --out: the path the translated file is written to")
    terms = read_glossary(glossary, glossary_ignore_case) if glossary is not None else None
    if terms is not None and ids:
        raise TwostepError("--glossary finds terms in text: it does not go with --ids")
    options = dict(beam_size=beam, n_best=n_best, length_penalty=length_penalty, sampling=sample,
                   temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens,
                   min_new_tokens=min_new_tokens, beam_stop=beam_stop, no_repeat_ngram_size=no_repeat_ngram_size,
                   replace_unknowns=replace_unknowns)  # None: the model's default
    extra = {"threads": threads} if threads else {}
    if device != "cpu":
        extra["device"] = device
    if file is not None:
        return translate_file(file, out, lambda: open_translator(model_dir, backend, checkpoint, options, **extra),
                              src_lang, tgt_lang, terms)
    split = split and not ids
    if text:
        sentences = list(text)
    elif split:
        sentences = [document] if (document := sys.stdin.read()).strip() else []
    else:
        sentences = [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not sentences:
        raise TwostepError("no input: give texts as arguments or on stdin")
    translator, be = open_translator(model_dir, backend, checkpoint, options, **extra)
    if terms is not None:
        with be:
            termed = translator.translate_glossary(sentences, terms, src_lang=src_lang, tgt_lang=tgt_lang, split=split)
        return print_termed(sentences, termed, as_json)
    with be:
        if ids:
            results = [[(" ".join(map(str, h.tokens)), h.score) for h in hyps]
                       for hyps in translator.decode_ids(parse_ids(sentences), tgt_lang=tgt_lang)]
        else:
            results = translator.translate_nbest(sentences, src_lang=src_lang, tgt_lang=tgt_lang, split=split)
    if as_json:
        emit_json([{"source": s, "translations": [{"text": t, "score": sc} for t, sc in hyps]}
                   for s, hyps in zip(sentences, results)])
    else:
        for hyps in results:
            for t, _ in hyps:  # verbatim: a document's own line breaks, then one to end it if it has none
                sys.stdout.write(t if t.endswith("\n") else t + "\n")


def read_glossary(path: Path, ignore_case: bool):
    """`--glossary`: the file's entries (TSV, or CSV by its suffix) as a Glossary."""
    from twostep.runtime.glossary import Glossary, parse_entries

    try:
        data = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TwostepError(f"--glossary {path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise TwostepError(f"--glossary {path}: not UTF-8 text") from None
    try:
        return Glossary(parse_entries(data, "csv" if path.suffix.lower() == ".csv" else "tsv", ignore_case))
    except BadInput as exc:
        raise TwostepError(f"--glossary {path}: {exc}") from None


def print_termed(sources: list[str], termed: list, as_json: bool) -> None:
    """`--glossary`'s translations, and the terms each applied and did not (on stderr unless --json)."""
    def terms(found) -> list[dict]:
        return [{"source": f.entry.source, "targets": list(f.entry.targets)} for f in found]

    if as_json:
        emit_json([{"source": s, "translations": [{"text": t.text}], "applied_terms": terms(t.applied),
                    "unmet_terms": terms(t.unmet)} for s, t in zip(sources, termed)])
        return
    for i, t in enumerate(termed):
        sys.stdout.write(t.text if t.text.endswith("\n") else t.text + "\n")
        if t.unmet:
            err.print(f"note: text {i + 1}: glossary terms not applied: "
                      + ", ".join(repr(f.entry.source) for f in t.unmet), markup=False, highlight=False)


def translate_file(file: Path, out: Path, opened: Callable[[], tuple], src_lang: Optional[str], tgt_lang: Optional[str],
                   glossary=None, part: int = 64) -> None:
    """`twostep translate --file`: the file's text nodes (twostep.runtime.files) translated, `part` at a time, each
    a document split into sentences, by the translator `opened()` gives (opened once the file is read), with the
    `glossary`'s terms where one is given; the file written to `out` with them."""
    from twostep.runtime import files

    try:
        data = file.read_bytes()
    except OSError as exc:
        raise TwostepError(f"--file {file}: cannot read it ({exc.strerror})") from None
    parsed = files.read(data, file.suffix)
    translator, be = opened()
    with be:
        if glossary is None:
            translations = [t for at in range(0, len(parsed.texts), part) for t in translator.translate(
                parsed.texts[at:at + part], src_lang=src_lang, tgt_lang=tgt_lang, split=True)]
        else:
            translations = [t.text for at in range(0, len(parsed.texts), part) for t in translator.translate_glossary(
                parsed.texts[at:at + part], glossary, src_lang=src_lang, tgt_lang=tgt_lang, split=True)]
    try:
        out.write_bytes(parsed.write(translations))
    except OSError as exc:
        raise TwostepError(f"--out {out}: cannot write it ({exc.strerror})") from None


@app.command()
def export(
    ckpt_dir: Path = typer.Argument(..., help="Checkpoint directory."),
    out_dir: Path = typer.Option(..., "--out",
                                 help="Artifact directory to write: new, empty, or (with --force) an earlier "
                                 "artifact."),
    opset: int = typer.Option(18, help="ONNX opset, 17..23."),
    dtype: str = typer.Option("fp32", help="fp32; fp16 (fragile ops kept fp32); int8 (dynamic quantization of the "
                              "weight MatMuls); int4 (4-bit weights in blocks, ONNX Runtime's MatMulNBits, CPU)."),
    optimize: bool = typer.Option(False, help="ONNX Runtime transformer fusions (ONNX Runtime only, not TensorRT)."),
    force: bool = typer.Option(False, "--force", help="Replace an earlier artifact at --out (never other files)."),
    inplace_cache: Optional[bool] = typer.Option(None, "--inplace-cache/--no-inplace-cache", show_default=False, help=(
        "The in-place decoder, an ONNX Runtime-only variant whose KV cache is written in place, which ort-cpu "
        "decodes with: written by default wherever the model allows it (fp32, int8 or int4, head size a multiple of "
        "8), sharing the plain decoder's weights. --inplace-cache insists on it; --no-inplace-cache leaves it "
        "out. The two plain graphs are written either way.")),
    variant: list[str] = typer.Option([], "--variant", help=(
        "Also write this variant (repeatable): decoder_inplace_standard is the in-place decoder in standard "
        "ONNX (opset 24 TensorScatter + Attention), for runtimes other than ONNX Runtime's CPU provider "
        "(docs/gpu.md); ort-cpu decodes with it only with kv_cache 'standard'.")),
    jobs: Optional[int] = typer.Option(None, min=1, show_default=False, help=(
        "Graphs built at once, in this process and in worker processes that each load the model (default: one "
        "a graph, at most one a core, within the memory available).")),
) -> None:
    """Export a checkpoint as encoder.onnx + decoder.onnx + manifest.json, validated against eager PyTorch
    on the export's shape grid (`twostep verify` checks the full grid)."""
    from twostep.artifact.spec import INPLACE
    from twostep.exporter.export import export as run_export

    variants = None if inplace_cache is None else [INPLACE] if inplace_cache else []
    with err.status("exporting") as status:
        result = run_export(ckpt_dir, out_dir, opset=opset, dtype=dtype, optimize=optimize, force=force,
                            variants=variants, also=variant, jobs=jobs, log=lambda m: status.update(m))
    worst = max(result.report.max_error.values(), default=0.0)
    out.print(f"wrote {result.path} in {result.seconds:.1f}s: {result.report.cases} shape cases validated, "
              f"max error {worst:.2e}")


@app.command()
def verify(
    art_dir: Path = typer.Argument(..., help="Artifact directory."),
    checkpoint: Path = typer.Option(..., help="The checkpoint it was exported from (the eager reference)."),
    backend: str = typer.Option("ort-cpu"),
    beam: int = typer.Option(4, min=2, help="Beam size of the beam-search check."),
    limit: Optional[int] = typer.Option(None, min=1, help="Only the first N test sentences."),
    device: str = typer.Option("cpu", help="Device of the eager PyTorch reference: cpu or cuda."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Graph parity on the shape grid, then greedy and beam outputs on the test split, against eager PyTorch."""
    from twostep.verify import verify as run_verify

    with err.status("verifying") as status:
        report = run_verify(art_dir, checkpoint, backend, beam, limit, device=device, log=lambda m: status.update(m))
    if as_json:
        emit_json(report.to_dict())
    else:
        table = Table(title=f"{backend} ({report.precision}) vs eager PyTorch (fp32)")
        table.add_column("output")
        table.add_column("max abs error", justify="right")
        for name, error in report.graphs.max_error.items():
            table.add_row(name, f"{error:.2e}")
        out.print(table)
        for failure in report.graphs.failures[:20]:
            out.print(f"[red]FAIL[/red] {failure}", highlight=False)
        for s in report.sequences:
            mark = "[green]ok[/green]" if s.share >= report.required_share else "[red]FAIL[/red]"
            out.print(f"{mark} {s.mode}: {s.identical}/{s.sentences} sequences identical to fp32 eager "
                      f"({100 * s.share:.1f}%, required {100 * report.required_share:.0f}%)")
        out.print("[green]verified[/green]" if report.ok else "[red]verification failed[/red]")
    if not report.ok:
        raise typer.Exit(1)


def int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise TwostepError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise TwostepError(f"{flag} takes positive integers, got {text!r}")
    return values


@app.command()
def bench(
    art_dir: Path = typer.Argument(..., help="Artifact directory."),
    backend: str = typer.Option("ort-cpu", help=(
        "Comma-separated backends; ratios are to the first. ort-cpu:concat, ort-cpu:inplace and "
        "ort-cpu:standard pin ort-cpu's decoder (the plain one, the in-place one, or the in-place one in "
        "standard ONNX of an artifact exported with --variant decoder_inplace_standard).")),
    checkpoint: Optional[Path] = typer.Option(None, help="Checkpoint, for the torch backend."),
    batch: str = typer.Option("1,32", help="Comma-separated batch sizes."),
    src_len: int = typer.Option(32, min=2),
    new_tokens: int = typer.Option(64, min=1),
    beam: int = typer.Option(1, min=1),
    threads: Optional[int] = typer.Option(None, min=1, help="Intra-op threads (default: the library's)."),
    warmup: int = typer.Option(3, min=0),
    iters: int = typer.Option(5, min=1),
    device: str = typer.Option("cpu", help="torch backend only: cpu or cuda."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Decode speed of backends on the same inputs with a fixed output length (EOS suppressed)."""
    from rich.progress import Progress

    from twostep.artifact import load_artifact
    from twostep.bench import Workload, split_name
    from twostep.bench import bench as run_bench
    from twostep.runtime import backends

    names = [b.strip() for b in backend.split(",") if b.strip()]
    bases = {n: split_name(n)[0] for n in names}  # ort-cpu:concat -> ort-cpu
    reasons = {n: backends.unavailable_reason(b, **({"device": device} if b == "torch" else {}))
               for n, b in bases.items()}
    if all(reasons.values()):  # nothing to measure: say what is missing and how to get it
        raise TwostepError("; ".join(f"backend {n!r} is not available here: {r}. Install: "
                                     f"{backends.backend_info(bases[n]).install}" for n, r in reasons.items()))
    config = load_artifact(art_dir, check_hashes=False).config
    if src_len > config.max_positions or new_tokens > config.max_positions:
        raise TwostepError(f"--src-len and --new-tokens must be at most max_positions {config.max_positions}")
    workloads = [Workload(b, src_len, new_tokens, beam) for b in int_list(batch, "--batch")]
    with Progress(console=err, transient=True) as progress:
        bar = progress.add_task("bench", total=len(names) * len(workloads) * (warmup + iters))
        results = run_bench(names, art_dir, checkpoint, workloads, warmup, iters, threads, device,
                            tick=lambda: progress.advance(bar))
    if as_json:
        emit_json([r.to_dict() for r in results])
        return
    table = Table(title=f"{art_dir} ({config.d_model}d, {config.n_encoder_layers}+{config.n_decoder_layers} layers, "
                        f"vocab {config.tgt_vocab_size}); medians of {iters}")
    columns = ("backend", "workload", "tokens/s", "ms/step", "p50 ms", "p95 ms", "p99 ms", "encoder ms", "load s",
               "peak RSS MB", "vs first", "GEMM floor ms", "GFLOP/s", "vs floor")
    for column in columns:
        table.add_column(column, justify="left" if column in ("backend", "workload") else "right")
    first = {r.workload: r for r in results if r.backend == names[0] and r.error is None}
    not_run = {}
    for r in results:
        if r.error:
            not_run[r.backend] = r.error
            table.add_row(r.backend, r.workload.label, "not run", *[""] * (len(columns) - 3))
            continue
        base = first.get(r.workload)
        ratio = f"{r.tokens_per_s / base.tokens_per_s:.2f}x" if base else "-"
        floor = (["-"] * 3 if r.gemm_floor_ms is None else
                 [f"{r.gemm_floor_ms:.2f}", f"{r.gemm_gflops:.1f}", f"{r.step_vs_gemm_floor:.2f}x"])
        table.add_row(r.backend, r.workload.label, f"{r.tokens_per_s:,.0f}", f"{r.ms_per_step:.2f}",
                      f"{r.latency_ms['p50']:.1f}", f"{r.latency_ms['p95']:.1f}", f"{r.latency_ms['p99']:.1f}",
                      f"{r.encoder_ms:.1f}", f"{r.load_s:.2f}", f"{r.peak_rss_mb:,.0f}", ratio, *floor)
    out.print(table)
    if any(r.gemm_floor_ms is not None for r in results):
        out.print("GEMM floor: ONNX Runtime's time for the decoder's weight products alone at batch x beam rows "
                  "(ort-cpu, rows > 1), and the rate it implies; vs floor: ms/step over it.", highlight=False)
    for name, reason in not_run.items():
        out.print(f"{name}: {reason}", markup=False, highlight=False)


@app.command("build-engine")
def build_engine_cmd(
    art_dir: Path = typer.Argument(..., help="Artifact directory (fp32 or fp16, exported without --optimize)."),
    fp16: bool = typer.Option(False, "--fp16", help="Let TensorRT use fp16 kernels for an fp32 artifact."),
    tf32: bool = typer.Option(False, "--tf32", help="Let fp32 MatMuls run on TF32 tensor cores (~1e-3 off fp32; "
                              "recorded as precision tf32). Off by default."),
    max_batch: int = typer.Option(DEFAULT_ROWS, min=1, help=f"Rows: batch x beam; at least {DEFAULT_ROWS}, the "
                                  "backends' default, so that they find these engines."),
    max_src_len: int = typer.Option(256, min=1, help="Capped by the model's max_positions."),
    max_new_tokens: int = typer.Option(256, min=2, help="Target positions; capped by max_positions less the "
                                       "steps' new tokens."),
) -> None:
    """Build (or reuse) TensorRT engines for both graphs, with the profile the trt backend derives from the
    manifest: the engines written here are the ones `--backend trt` finds."""
    from twostep.artifact import load_artifact
    from twostep.runtime import backends
    from twostep.runtime.backends.profile import Profile
    from twostep.runtime.backends.trt import build_engine, engine_precision

    reason = backends.unavailable_reason("trt")
    if reason:
        raise TwostepError(f"TensorRT is not available here: {reason}")
    artifact = load_artifact(art_dir)
    profile = Profile.sized_for(artifact.config, rows=max_batch, src_len=max_src_len, new_tokens=max_new_tokens)
    precision = engine_precision(artifact, fp16, tf32)
    for graph in artifact.graphs:
        path = build_engine(artifact, graph, profile, precision, log=lambda m: err.print(m))
        out.print(f"{graph}: {path}", markup=False, highlight=False)


@app.command()
def inspect(art_dir: Path = typer.Argument(..., help="Artifact directory.")) -> None:
    """The artifact's graphs and their inputs and outputs, from the manifest."""
    from twostep.artifact import SCHEMA_VERSION, load_artifact

    artifact = load_artifact(art_dir, check_hashes=False)
    m, c = artifact.manifest, artifact.config
    out.print(f"{art_dir}: schema {SCHEMA_VERSION}, opset {m.opset}, {m.dtype}, "
              f"{c.d_model}d {c.n_encoder_layers}+{c.n_decoder_layers} layers {c.n_heads} heads, "
              f"vocab {c.src_vocab_size}/{c.tgt_vocab_size}, max positions {c.max_positions}")
    needs = {"onnxruntime": "ONNX Runtime only"}  # what a variant's runtime says, in words

    titled = [(e.name, e.spec, f"{e.name} ({e.file})" if e.runtime is None else
               f"{e.name} ({e.file}; {needs.get(e.runtime, e.runtime)}: {', '.join(e.ops)})")
              for e in m.graphs.values()]
    for _, spec, title in titled:
        table = Table(title=title)
        for column in ("", "name", "dtype", "shape"):
            table.add_column(column)
        for kind, tensors in (("in", spec.inputs), ("out", spec.outputs)):
            for t in tensors:
                table.add_row(kind, t.name, t.dtype, Text("[" + ", ".join(map(str, t.shape)) + "]"))
        out.print(table)


@app.command("serve")
def serve_cmd(
    model_dirs: list[Path] = typer.Argument(..., help="Artifact directories (any backend), or folders of them (each "
                                            "subfolder an artifact), or one checkpoint (torch). Each request goes "
                                            "to the model that has its language pair (docs/serving.md)."),
    backend: Optional[str] = typer.Option(None, help="Default ort-cpu for artifacts, torch for checkpoints."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on; loopback unless you mean otherwise."),
    port: int = typer.Option(8000, min=0, max=65535),
    # the batching limits: defaults and help from BatchLimits
    max_batch_tokens: int = typer.Option(BatchLimits.max_batch_tokens, min=1, help=BatchLimits.doc("max_batch_tokens")),
    max_batch_rows: int = typer.Option(BatchLimits.max_batch_rows, min=1, help=BatchLimits.doc("max_batch_rows")),
    max_wait_ms: float = typer.Option(BatchLimits.max_wait_ms, min=0, help=BatchLimits.doc("max_wait_ms")),
    max_queue: int = typer.Option(BatchLimits.max_queue, min=1, help=BatchLimits.doc("max_queue")),
    batching: str = typer.Option(BatchLimits().batching, help=BatchLimits.doc("inflight")),
    express_tokens: int = typer.Option(BatchLimits.express_tokens, min=0, help=BatchLimits.doc("express_tokens")),
    express_share: float = typer.Option(BatchLimits.express_share, min=0.01, max=0.99,
                                        help=BatchLimits.doc("express_share")),
    # the admission limits: checked by BatchLimits (a bad value is one line)
    max_beam: int = typer.Option(BatchLimits.max_beam, help=BatchLimits.doc("max_beam")),
    max_new_tokens: Optional[int] = typer.Option(BatchLimits.max_new_tokens, help=BatchLimits.doc("max_new_tokens")),
    max_request_work: int = typer.Option(BatchLimits.max_request_work, help=BatchLimits.doc("max_request_work")),
    max_sentences: int = typer.Option(64, min=1, help="Sentences per request, once its documents are split; beyond "
                                      "it 413 (LibreTranslate's API: 400)."),
    max_chars: int = typer.Option(20_000, "--max-chars", "--char-limit", min=1, help="Characters per request, all "
                                  "its texts together (--char-limit: LibreTranslate's name); beyond it 413 "
                                  "(LibreTranslate's API: 400). A keys database's key may have its own."),
    batch_limit: Optional[int] = typer.Option(None, min=1, help="Texts per request (LibreTranslate's --batch-limit); "
                                              "beyond it 413 (LibreTranslate's API: 400). Default: none but "
                                              "--max-sentences."),
    alternatives_limit: Optional[int] = typer.Option(None, min=0, help="Alternatives per request on "
                                                     "LibreTranslate's API (its --alternatives-limit); beyond it 400. "
                                                     "Default, and at most: the beam limit - 1."),
    req_limit: Optional[int] = typer.Option(None, min=1, help="Requests per minute per client, its API key or else "
                                            "its address, a list of N texts counting N (LibreTranslate's "
                                            "--req-limit); beyond it 429. A keys database's key has its own. "
                                            "Default: no limit."),
    threads: Optional[int] = typer.Option(None, min=1, help="Intra-op threads of each model (default: the library's)."),
    pivot: str = typer.Option("en", help="A pair no model has goes through this language (two models: the first's "
                              "best translation is the second's source); 'none': no pivoting."),
    max_loaded: Optional[int] = typer.Option(None, min=1, help="Models loaded at once: the others load on first use, "
                                             "the least recently used one leaving (default: all, at start)."),
    shutdown_delay: float = typer.Option(0, min=0, help="On SIGTERM, seconds that /readyz answers 503 while "
                                         "requests are still answered (for load balancers to stop sending), before "
                                         "the listener closes; a second SIGTERM or Ctrl-C ends them. Not with --ray."),
    api_key_file: Optional[Path] = typer.Option(None, help="Require Authorization: Bearer KEY (LibreTranslate's "
                                                "/translate: or api_key) on the APIs, KEY a line of this file (blank "
                                                "lines and # comments ignored); keys also from TWOSTEP_API_KEYS, "
                                                "separated by commas."),
    api_key_db: Optional[Path] = typer.Option(None, help="Require a key (as --api-key-file) of this SQLite database "
                                              "(twostep keys add), each with its own requests per minute and "
                                              "characters per request; beside --api-key-file. Looked up at each "
                                              "request: keys added or removed count at once."),
    protect_metrics: bool = typer.Option(False, "--protect-metrics", help="/metrics needs an API key too."),
    suggestions: bool = typer.Option(False, "--suggestions", help="Take suggested translations (LibreTranslate's "
                                     "POST /suggest) into --suggestions-db; `twostep suggestions` exports them."),
    suggestions_db: Path = typer.Option(Path("db/suggestions.db"), help="--suggestions: the SQLite file, created "
                                        "if absent (LibreTranslate's own, and its default path, work as they are)."),
    disable_files_translation: bool = typer.Option(False, "--disable-files-translation", help="No POST "
                                                   "/translate_file (LibreTranslate's option)."),
    file_size_limit: int = typer.Option(10 * 1024 * 1024, min=1, help="Bytes of one file POST /translate_file "
                                        "takes; beyond it 413."),
    files_ttl: float = typer.Option(1800, min=0, help="Seconds a translated file waits for its download "
                                    "(GET /download_file/NAME) before it is removed (LibreTranslate: 30 minutes)."),
    files_dir: Optional[Path] = typer.Option(None, help="Where translated files wait for their download (default: "
                                             "a temporary folder, removed when the server exits)."),
    glossaries: Optional[Path] = typer.Option(None, "--glossaries", help="Store glossaries (POST /v1/glossaries) in "
                                              "this SQLite file, created if absent; without it they are kept in "
                                              "memory and lost when the server stops (with --ray: each replica its "
                                              "own)."),
    ray: bool = typer.Option(False, "--ray", help="Serve through Ray Serve (pip install 'twostep\\[ray]')."),
    address: Optional[str] = typer.Option(None, help="--ray: join this Ray cluster (ray start --head) instead "
                                          "of starting a local one."),
    replicas: int = typer.Option(1, min=1, help="--ray: replicas, each with its own model and batcher."),
    autoscale: Optional[str] = typer.Option(None, help="--ray: MIN:MAX replicas, scaled on ongoing requests."),
    num_cpus: float = typer.Option(1.0, min=0, help="--ray: CPUs each replica reserves."),
    graceful_shutdown_wait_loop: Optional[float] = typer.Option(None, min=0, help="--ray: seconds between a stopping "
                                                                "replica's checks for requests in flight (Ray Serve's "
                                                                "graceful_shutdown_wait_loop_s, default 2)."),
    graceful_shutdown_timeout: Optional[float] = typer.Option(None, min=0, help="--ray: seconds a stopping replica "
                                                              "gets to answer them before it is killed (Ray Serve's "
                                                              "graceful_shutdown_timeout_s, default 20)."),
) -> None:
    """Serve translations over HTTP, one model or many: twostep's API (POST /v1/translate: documents, streams; GET
    /v1/languages), LibreTranslate's (POST /translate, /detect, /translate_file; GET /languages,
    /frontend/settings, /download_file/NAME, /health, /spec), /healthz, /readyz, /metrics (Prometheus); glossaries
    (POST, GET /v1/glossaries, GET /v1/glossaries/ID and ID/entries, DELETE /v1/glossaries/ID)."""
    try:
        from twostep.serving.http import ServeConfig, read_api_keys
    except ImportError as exc:
        raise TwostepError(f"serving needs its extra: pip install 'twostep[serve]' ({exc})") from None
    if batching not in BATCHING:
        raise TwostepError(f"--batching takes {' or '.join(BATCHING)}, got {batching!r}")
    if api_key_db is not None:
        from twostep.serving.keys import KeyDatabase

        KeyDatabase(api_key_db).close()  # a missing or bad database is one line, before the models are read
    pivot_language = None if pivot.lower() == "none" else pivot
    check_servable(model_dirs, backend, pivot_language)
    limits = BatchLimits(max_batch_tokens=max_batch_tokens, max_batch_rows=max_batch_rows, max_wait_ms=max_wait_ms,
                         max_queue=max_queue, inflight=BATCHING[batching], express_tokens=express_tokens,
                         express_share=express_share, max_beam=max_beam, max_new_tokens=max_new_tokens,
                         max_request_work=max_request_work)
    config = ServeConfig(tuple(str(d.resolve()) for d in model_dirs), backend, threads, limits,
                         max_sentences=max_sentences, max_chars=max_chars, batch_limit=batch_limit,
                         alternatives_limit=alternatives_limit, req_limit=req_limit,
                         api_key_digests=read_api_keys(api_key_file),
                         api_key_db=str(api_key_db.resolve()) if api_key_db else None,
                         protect_metrics=protect_metrics, pivot=pivot_language, max_loaded=max_loaded,
                         suggestions=str(opened_suggestions(suggestions_db)) if suggestions else None,
                         files_translation=not disable_files_translation, file_size_limit=file_size_limit,
                         files_ttl_s=files_ttl, files_dir=str(files_dir) if files_dir else None,
                         glossaries=str(opened_glossaries(glossaries)) if glossaries else None)
    if not ray:
        from twostep.serving.http import serve

        serve(config, host, port, shutdown_delay)
        return
    if shutdown_delay:
        raise TwostepError("--shutdown-delay is the uvicorn server's; with --ray, Ray Serve's proxy takes the "
                           "requests and its replicas drain by --graceful-shutdown-wait-loop and "
                           "--graceful-shutdown-timeout (docs/serving.md, Draining)")
    from twostep.serving import ray_app

    scaling = None
    if autoscale:
        try:
            low, high = (int(x) for x in autoscale.split(":"))
        except ValueError:
            raise TwostepError(f"--autoscale takes MIN:MAX, got {autoscale!r}") from None
        scaling = {"min_replicas": low, "max_replicas": high, "target_ongoing_requests": 2 * max_batch_rows}
    shutdown = {key: value for key, value in zip(ray_app.SHUTDOWN_KEYS, (graceful_shutdown_wait_loop,
                                                                         graceful_shutdown_timeout))
                if value is not None}
    ray_app.run(config, host, port, replicas, num_cpus, scaling, address, shutdown)


keys_app = typer.Typer(no_args_is_help=True, help="API keys with limits of their own, in the SQLite database that "
                       "twostep serve --api-key-db reads (LibreTranslate's ltmanage keys). It keeps each key's SHA-256 "
                       "digest, never the key.")
app.add_typer(keys_app, name="keys")
KEY_DB = typer.Option(..., "--api-key-db", help="The keys database (SQLite).")


@keys_app.command("add")
def keys_add(
    req_limit: int = typer.Argument(..., min=1, help="Requests per minute of this key."),
    api_key_db: Path = KEY_DB,
    key: Optional[str] = typer.Option(None, help="The key (default: a new random one)."),
    char_limit: int = typer.Option(0, min=0, help="Characters per request, all its texts together; 0: the "
                                   "server's (--char-limit)."),
) -> None:
    """Add a key, or give one already there these limits; print it (the database keeps only its digest). Makes
    the database if it is not there."""
    from twostep.serving.keys import KeyDatabase

    out.print(KeyDatabase(api_key_db, "rwc").add(req_limit, key, char_limit or None), markup=False,
              highlight=False)


@keys_app.command("remove")
def keys_remove(key: str = typer.Argument(..., help="The key, or its digest as list shows it."),
                api_key_db: Path = KEY_DB) -> None:
    """Remove a key: a server that reads the database refuses it from its next request."""
    from twostep.serving.keys import KeyDatabase

    if not KeyDatabase(api_key_db, "rw").remove(key):
        raise TwostepError(f"no such key in {api_key_db}: give the key, or its digest as twostep keys list shows it")
    out.print("removed", markup=False, highlight=False)


@keys_app.command("list")
def keys_list(api_key_db: Path = KEY_DB) -> None:
    """Each key's SHA-256 digest, requests per minute and characters per request."""
    from twostep.serving.keys import KeyDatabase

    keys = KeyDatabase(api_key_db).all()
    if not keys:
        out.print("There are no API keys")
    for digest, limits in keys:
        chars = limits.char_limit if limits.char_limit is not None else "the server's"
        out.print(f"{digest}: {limits.req_limit} requests per minute, {chars} characters per request", markup=False,
                  highlight=False)


def check_servable(model_dirs: list[Path], backend: Optional[str], pivot: Optional[str]) -> None:
    """Refuse before the server starts: a bad artifact, models that cannot share a server (twostep.serving.models:
    Catalog.open) or an unavailable backend is one line, not a traceback from inside uvicorn's startup. One
    model's files are checked whole; many models' manifests only (each is checked whole as it loads)."""
    from twostep.artifact import MANIFEST, load_artifact
    from twostep.runtime import backends
    from twostep.serving.models import Catalog, model_paths

    paths = model_paths(model_dirs)
    for model_dir in paths:
        if (model_dir / MANIFEST).is_file():
            load_artifact(model_dir, check_hashes=len(paths) == 1)
        elif not (model_dir / "config.json").is_file():
            raise TwostepError(f"{model_dir}: neither an artifact directory ({MANIFEST}) nor a checkpoint "
                               "(config.json)")
        elif len(paths) > 1:
            raise TwostepError(f"{model_dir}: a checkpoint serves alone; export it (twostep export) to serve it "
                               "beside other models")
    Catalog.open(paths, pivot)
    names = {backend or ("ort-cpu" if (d / MANIFEST).is_file() else "torch") for d in paths}
    for name in sorted(names):
        reason = backends.unavailable_reason(name)
        if reason:
            raise TwostepError(f"backend {name!r} is not available here: {reason}")


def opened_glossaries(path: Path) -> Path:
    """The glossaries database, created (or checked) before the server starts: a bad path is one line."""
    from twostep.serving.glossaries import Glossaries

    Glossaries(path).close()
    return path.resolve()


def opened_suggestions(path: Path) -> Path:
    """The suggestions database, created (or checked) before the server starts: a bad path is one line."""
    from twostep.serving.suggestions import Suggestions

    Suggestions(path).close()
    return path.resolve()


suggestions_app = typer.Typer(no_args_is_help=True, help="Suggested translations (`twostep serve --suggestions`).")
app.add_typer(suggestions_app, name="suggestions")


@suggestions_app.command("export")
def suggestions_export(
    database: Path = typer.Argument(..., help="The SQLite file `twostep serve --suggestions` (or LibreTranslate) "
                                    "wrote."),
    out_dir: Path = typer.Option(..., "--out", help="Folder for the corpus (created; existing files are refused)."),
) -> None:
    """Write the suggestions as a parallel corpus: for each language pair, two line-aligned files (en-fr.en,
    en-fr.fr), as OPUS and sacrebleu name them."""
    from twostep.serving.suggestions import export

    written, skipped = export(database, out_dir)
    for (source, target), n in sorted(written.items()):
        out.print(f"{source}-{target}: {n} sentence pairs")
    if skipped:
        out.print(f"skipped {skipped} suggestion(s) whose language codes are not codes")
    out.print(f"wrote {out_dir}")


@app.command("init")
def init_cmd(
    out_dir: Path = typer.Option(..., "--out"),
    preset: str = typer.Option("base", help="tiny, demo or base."),
    vocab: int = typer.Option(32000, min=8, help="Source and target vocab size."),
    tgt_vocab: Optional[int] = typer.Option(None, min=8, help="Target vocab size, when it differs."),
    seed: int = typer.Option(0),
    force: bool = typer.Option(False, "--force", help="Replace an earlier checkpoint at --out (never other files)."),
) -> None:
    """Write a checkpoint with random (xavier) weights, for benchmarks at real sizes without training."""
    from twostep.model.init import init_checkpoint

    ckpt = init_checkpoint(out_dir, preset, vocab, tgt_vocab, seed, force=force)
    out.print(f"wrote {out_dir}: preset {preset}, {ckpt.model.num_parameters():,} parameters")


@app.command("import")
def import_cmd(
    src: Path = typer.Argument(..., help="A transformers model directory (Marian/OPUS-MT, M2M100, NLLB, mBART-50), "
                               "a CTranslate2 model directory, an Argos Translate package (.argosmodel or its folder), "
                               "or hub name (ORG/NAME, downloaded with the hub extra), or a torch.save'd state dict "
                               "of a seed family (loaded with weights_only=True)."),
    out_dir: Path = typer.Option(..., "--out"),
    fmt: Optional[str] = typer.Option(None, "--format", help="A directory: argos, ctranslate2, or marian, m2m_100, "
                                      "nllb or mbart (default: found; a transformers directory's config.json's "
                                      "model_type). A state dict: annotated, jadore, mha or "
                                      "nn-transformer."),
    n_heads: Optional[int] = typer.Option(None, "--heads", min=1, help="A state dict's attention heads (shapes "
                                          "cannot tell)."),
    tokenizer: Optional[Path] = typer.Option(None, help="A state dict: SentencePiece model to ship with it. A "
                                             "CTranslate2 directory: its SentencePiece model (default: found in it)."),
    target_tokenizer: Optional[Path] = typer.Option(None, help="A CTranslate2 directory: the target side's "
                                                    "SentencePiece model, where it has its own."),
    src_lang: Optional[str] = typer.Option(None, help="A bilingual model's source language (BCP-47 or ISO 639: "
                                           "en), where its files name none or another (a CTranslate2 directory)."),
    tgt_lang: Optional[str] = typer.Option(None, help="A bilingual model's target language (de), likewise."),
    max_positions: Optional[int] = typer.Option(None, min=1, help="A state dict: keep only the first N positions."),
    scale_emb_or_prj: str = typer.Option("prj", help="jadore: 'emb', 'prj' or 'none', as it was trained."),
    pad_id: int = typer.Option(0), unk_id: int = typer.Option(1), bos_id: int = typer.Option(2),
    eos_id: int = typer.Option(3),
    force: bool = typer.Option(False, "--force", help="Replace an earlier checkpoint at --out (never other files)."),
) -> None:
    """Import a pretrained model (a transformers directory) or a foreign checkpoint (seed families, PyTorch's
    nn.Transformer tutorial) into a twostep checkpoint."""
    from twostep.model.sources import import_model, is_model_source

    if is_model_source(src):  # a transformers or CTranslate2 directory, an Argos package, a hub name ORG/NAME
        ckpt = import_model(src, out_dir, fmt, force=force, tokenizer=tokenizer, target_tokenizer=target_tokenizer,
                            src_lang=src_lang, tgt_lang=tgt_lang)
        fmt = ckpt.info["imported_from"]["format"]
        for note in ckpt.info["imported_from"]["notes"]:
            err.print(f"note: {note}", markup=False, highlight=False)
    else:
        from twostep.model.importers import ImportOptions, import_state_dict_file

        if fmt is None or n_heads is None:
            raise BadInput(f"{src} is a state dict file: give its --format and --heads (a transformers model is a "
                           "directory)")
        if src_lang is not None or tgt_lang is not None:
            raise BadInput(f"{src} is a state dict file: --src-lang and --tgt-lang name the languages of a model "
                           "directory or package")
        options = ImportOptions(n_heads=n_heads, max_positions=max_positions, scale_emb_or_prj=scale_emb_or_prj,
                                pad_id=pad_id, unk_id=unk_id, bos_id=bos_id, eos_id=eos_id)
        ckpt = import_state_dict_file(src, fmt, out_dir, options, tokenizer, force=force)
    c = ckpt.config
    out.print(f"wrote {out_dir}: {fmt}, {c.d_model}d, {c.n_encoder_layers}+{c.n_decoder_layers} layers, "
              f"{c.n_heads} heads, {ckpt.model.num_parameters():,} parameters")
    if ckpt.info.get("decoding"):  # what translate, serve and the C++ library decode with where nothing is said
        out.print("decoding defaults: " + ", ".join(f"{k} {v}" for k, v in ckpt.info["decoding"].items()),
                  markup=False, highlight=False)


def main() -> None:
    try:
        app()
    except TwostepError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
