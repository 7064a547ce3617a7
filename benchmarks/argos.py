"""LibreTranslate's workload on an Argos-sized model: CTranslate2 as argostranslate runs it against twostep's
import of the same CTranslate2 directory, int8 and fp32, side by side in one run.

    python -m benchmarks.argos [--work DIR] [--sentences 1,8,32] [--new-tokens N] [--rounds N] [--threads 2]
                               [--engines ct2-int8,twostep-int8,ct2-int8-examples,ct2-fp32,twostep-fp32]
                               [--markdown FILE] [--json FILE] [--smoke]

The model is argos-train's (config.yml: OpenNMT-py transformer, 6+6 layers, d_model 512, 8 heads, d_ff 2048,
a shared vocabulary of 50,000 pieces, share_embeddings and share_decoder_embeddings, position_encoding), with
random weights (xavier, seed 0) written as an OpenNMT-py checkpoint (benchmarks/opennmt_py.py) and converted by
CTranslate2's own OpenNMTPyConverter, `--quantization int8` as argostranslate's train.py converts, and float32.

Sentences end at varied lengths. A random model repeats one token and hardly ever picks </s>; so the </s> row
of the tied embedding and its generator bias are fitted (least squares over the decoder's final states along
each benchmark sentence's greedy path, computed with </s> excluded) so that greedy decoding ends each sentence
at about its source length x 1.1, 17-33 tokens. Nothing else in the model sees that row (no source or earlier
target token is </s>), so the paths up to the end are the random model's own. Beam search ends near those
lengths. Both engines get the same cap, `--new-tokens` (CTranslate2 max_decoding_length, twostep
max_new_tokens), which the table says how often was hit. Sources: 32 sentences of 15-30 random pieces
(ids 4..vocab), the same for every engine and workload.

The engines, each in its own worker process (benchmarks/marian.py's Worker), `--threads` intra-op threads:

- ct2-int8: the int8 directory as LibreTranslate runs it: `ctranslate2.Translator(dir, device="cpu",
  compute_type="auto", inter_threads=1, intra_threads=threads)` and argostranslate's translate_batch
  (apply_packaged_translation: beam_size 4, num_hypotheses 1, length_penalty 0.2, replace_unknowns,
  max_batch_size 32, batch_type "tokens", return_scores) on the pieces. batch_type "tokens" with 32 means
  sub-batches of at most 32 source pieces: with 15-30 pieces a sentence, CTranslate2 decodes LibreTranslate's
  requests about one sentence at a time.
- ct2-int8-examples: the same with batch_type "examples" (32 sentences a batch): CTranslate2 batching as
  twostep does, for comparison; no target.
- twostep-int8: `twostep import` of the int8 directory (dequantized to float32), `twostep export --dtype
  int8` (ONNX Runtime dynamic int8); `open_translator` (ort-cpu, batches of 32 sentences) with what an
  imported Argos package decodes with: beam 4, length_penalty 0.2, beam_stop "ctranslate2", min_new_tokens 1,
  replace_unknowns.
- ct2-fp32 / twostep-fp32: the same from the float32 conversion, CTranslate2 with compute_type "float32"
  ("auto" would quantize the float32 model to int8 on loading: it picks the fastest type the CPU runs).

Workloads: requests of 1, 8 and 32 sentences (`--sentences`) covering the same 32 sentences (32, 4 and 1
requests). One warm-up request per engine and workload, then `--rounds` rounds; in each round every engine runs
every request of the workload, the engines' order rotated from round to round, so that the shared machine's
drift falls on all of them alike. The table: median request latency, sentences/s and generated tokens/s (each
engine's own tokens) over the median round, and twostep's speedup = CTranslate2's median round time /
twostep's for the same requests, against the issue's targets (int8: 1.5x at 1 and 8 sentences, 1.3x at 32).

`--smoke`: a tiny model (d_model 32, 2+2 layers, 300 pieces), 8 sentences, requests of 1 and 8, 1 round;
seconds, for the test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.marian import Worker, batches_of, cpu_model, load_average, run_cmd, twostep_cli, versions
from benchmarks.opennmt_py import ARGOS, BOS, EOS, PAD, SPECIALS, Size

ENGINES = ("ct2-int8", "twostep-int8", "ct2-int8-examples", "ct2-fp32", "twostep-fp32")
LABELS = {"ct2-int8": "CTranslate2 int8 (LibreTranslate's settings)", "twostep-int8": "twostep int8 (ort-cpu)",
          "ct2-int8-examples": "CTranslate2 int8, batch_type examples", "ct2-fp32": "CTranslate2 fp32",
          "twostep-fp32": "twostep fp32 (ort-cpu)"}
# twostep's engine, CTranslate2's, and the speedup the issue asks for at each request size (None: none asked)
PAIRS = (("twostep-int8", "ct2-int8", {1: 1.5, 8: 1.5, 32: 1.3}), ("twostep-fp32", "ct2-fp32", {}),
         ("twostep-int8", "ct2-int8-examples", {}))
BEAM, LENGTH_PENALTY, MAX_BATCH = 4, 0.2, 32  # argostranslate's settings


@dataclass(frozen=True)
class Model:
    name: str
    vocab: int
    size: Size
    n_sentences: int
    src_lengths: tuple[int, int]


FULL = Model("argos", 50000, ARGOS, 32, (15, 30))
SMOKE = Model("smoke", 300, Size(d_model=32, n_heads=4, d_ff=64, n_layers=2), 8, (15, 30))
LENGTH_RATIO = 1.1  # greedy decoding ends each sentence at about this x its source length


# ---------------------------------------------------------------------------------------------- the model


def make_sentences(model: Model, seed: int = 0) -> list[list[int]]:
    """Source ids: 15-30 random ordinary pieces each (no specials). OpenNMT-py sources carry no </s>."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(len(SPECIALS), model.vocab) for _ in range(rng.randint(*model.src_lengths))]
            for _ in range(model.n_sentences)]


def vocabulary(model: Model) -> list[str]:
    return SPECIALS + [f"\u2581t{i}" for i in range(len(SPECIALS), model.vocab)]


def greedy_states(net, sentences: list[list[int]], steps: int):
    """Along each sentence's greedy path with </s> excluded: the decoder's final state at every step (N, T, D)
    and the best logit other than </s>'s (N, T)."""
    import torch

    width = max(map(len, sentences))
    src = torch.tensor([s + [PAD] * (width - len(s)) for s in sentences])
    src_mask = (src != PAD)[:, None]
    generator = net.generator
    states, best = [], []
    with torch.no_grad():
        memory = net.encoder(src, src_mask)
        tgt = torch.full((len(sentences), 1), BOS)
        for _ in range(steps):
            h = net.decoder(tgt, memory, src_mask)[:, -1]  # (N, D)
            logits = generator(h)
            logits[:, EOS] = float("-inf")
            top, token = logits.max(-1)
            states.append(h)
            best.append(top)
            tgt = torch.cat([tgt, token[:, None]], 1)
    return torch.stack(states, 1), torch.stack(best, 1)


def fit_eos(net, sentences: list[list[int]], log) -> dict:
    """Set the </s> row of the tied embedding and the generator's </s> bias so that greedy decoding ends sentence
    n after about targets[n] tokens: least squares on margin(n, t) = h(n, t).e + b - best(n, t) = slope x (t + 0.5
    - targets[n]) over the steps up to a few past each target, ridge-regularized. Returns what it aimed at and
    the greedy lengths it gives (the model's own, before conversion)."""
    import torch

    targets = [round(LENGTH_RATIO * len(s)) for s in sentences]
    steps = max(targets) + 4
    started = time.perf_counter()
    h, best = greedy_states(net, sentences, steps)
    rows, want = [], []
    slope = 0.5
    for n, target in enumerate(targets):
        t = torch.arange(min(steps, target + 4))
        rows.append(torch.cat([h[n, : len(t)], torch.ones(len(t), 1)], 1))
        want.append(best[n, : len(t)] + slope * (t + 0.5 - target))
    a, y = torch.cat(rows).double(), torch.cat(want).double()
    ridge = 1e-3 * torch.eye(a.shape[1], dtype=torch.double)
    x = torch.linalg.solve(a.T @ a + ridge, a.T @ y).float()
    with torch.no_grad():
        net.generator.weight[EOS] = x[:-1]  # the tied embedding's row: the decoder never reads it before </s>
        net.generator.bias[EOS] = x[-1]
        margin = h @ x[:-1] + x[-1] - best  # (N, T)
    ended = [int(row.nonzero()[0]) if bool(row.any()) else None for row in margin > 0]
    lengths = [steps if e is None else e for e in ended]
    log(f"</s> fitted in {time.perf_counter() - started:.0f} s: greedy lengths {min(lengths)}-{max(lengths)} "
        f"(aimed at {min(targets)}-{max(targets)}; {sum(e == t for e, t in zip(lengths, targets))} exactly)")
    return {"targets": targets, "greedy_lengths": lengths, "eos_row_norm": float(x[:-1].norm()),
            "eos_bias": float(x[-1])}


def build_checkpoint(out: Path, model: Model, sentences: list[list[int]], log, seed: int = 0) -> Path:
    """`out`/model.pt: argos-train's model with random weights and the fitted </s>."""
    import torch

    from benchmarks.opennmt_py import build_model, init_glorot, save_checkpoint

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(seed)
        net = build_model(model.vocab, model.size, add_qkvbias=False).eval()
        init_glorot(net)
        fitted = fit_eos(net, sentences, log)
    finally:
        torch.set_num_threads(threads)
    (out / "eos_fit.json").parent.mkdir(parents=True, exist_ok=True)
    (out / "eos_fit.json").write_text(json.dumps(fitted))
    return save_checkpoint(net, vocabulary(model), model.size, False, out / "model.pt")


def small_spm(path: Path) -> Path:
    """A loadable SentencePiece model for `twostep import` to ship: the engines take pieces and ids, never
    text, so it only has to load."""
    import io

    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["the quick brown fox jumps over the lazy dog"] * 20),
                                   model_writer=buf, vocab_size=32, model_type="char", character_coverage=1.0,
                                   minloglevel=2)
    path.write_bytes(buf.getvalue())
    return path


def prepare(work: Path, model: Model, sentences: list[list[int]], engines: list[str], log) -> dict[str, Path]:
    """Build (or reuse) the checkpoint, its two CTranslate2 conversions and twostep's imports and exports."""
    from benchmarks.opennmt_py import convert_opennmt_py

    paths = {"ckpt": work / "opennmt-py" / "model.pt", "spm": work / "sentencepiece.model"}
    if not paths["ckpt"].is_file():
        log(f"building the random {model.name} model (OpenNMT-py checkpoint)")
        build_checkpoint(paths["ckpt"].parent, model, sentences, log)
    if not paths["spm"].is_file():
        small_spm(paths["spm"])
    for dtype, quantization in (("int8", "int8"), ("fp32", None)):
        ct2 = paths[f"ct2-{dtype}"] = work / f"ct2-{dtype}"
        if not (ct2 / "model.bin").is_file():
            log(f"ct2-opennmt-py-converter --quantization {quantization or 'float32'}")
            convert_opennmt_py(paths["ckpt"], ct2, quantization)
            shutil.copy(paths["spm"], ct2 / "sentencepiece.model")  # where `twostep import` finds it
        paths[f"ct2-{dtype}-examples"] = ct2
        art, ckpt = work / f"twostep-{dtype}", work / f"twostep-{dtype}-ckpt"
        paths[f"twostep-{dtype}"] = art
        if f"twostep-{dtype}" in engines and not (art / "manifest.json").is_file():
            log(f"twostep import {ct2.name}, export --dtype {dtype}")
            run_cmd(twostep_cli("import", ct2, "--out", ckpt, "--force"), "twostep import")
            run_cmd(twostep_cli("export", ckpt, "--out", art, "--dtype", dtype, "--force"), "twostep export")
    return paths


# ---------------------------------------------------------------------------------------------- the engines
# Each returns decode(sentences as ids) -> each sentence's best hypothesis as ids, and what it runs on.


def twostep_engine(spec: dict):
    from twostep.runtime.decoding import DecodeOptions
    from twostep.runtime.translator import open_translator

    # what an imported Argos package decodes with (twostep.model.argos.DECODING), with this run's cap
    options = DecodeOptions(beam_size=BEAM, length_penalty=LENGTH_PENALTY, max_new_tokens=spec["new_tokens"],
                            beam_stop="ctranslate2", min_new_tokens=1, replace_unknowns=True)
    translator, backend = open_translator(Path(spec["path"]), batch_size=MAX_BATCH, options=options,
                                          threads=spec["threads"])
    info = versions("onnxruntime", "numpy")
    info.update(backend=f"{backend.name}, decoder {getattr(backend, 'decoder', '?')}", beam_stop=options.beam_stop)
    return translator.translate_ids, info


def ct2_engine(spec: dict):
    import ctranslate2

    translator = ctranslate2.Translator(spec["path"], device="cpu", compute_type=spec["compute_type"], inter_threads=1,
                                        intra_threads=spec["threads"])
    names = json.loads((Path(spec["path"]) / "shared_vocabulary.json").read_text())
    ids = {t: i for i, t in reversed(list(enumerate(names)))}

    def decode(batch):
        results = translator.translate_batch(
            [[names[i] for i in s] for s in batch], target_prefix=None, replace_unknowns=True,
            max_batch_size=MAX_BATCH, batch_type=spec["batch_type"], beam_size=BEAM, num_hypotheses=1,
            length_penalty=LENGTH_PENALTY, return_scores=True, max_decoding_length=spec["new_tokens"])
        return [[ids[t] for t in r.hypotheses[0]] for r in results]

    info = versions("ctranslate2")
    info.update(compute_type=translator.compute_type, batch_type=spec["batch_type"],
                supported=",".join(sorted(ctranslate2.get_supported_compute_types("cpu"))))
    return decode, info


def worker_main(spec: dict) -> int:
    """Serve one engine over stdin/stdout, one JSON line each way: {"requests": [sentences, ...]} -> each
    request's seconds and each sentence's tokens."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    started = time.perf_counter()
    decode, info = (twostep_engine if spec["kind"] == "twostep" else ct2_engine)(spec)
    proto.write(json.dumps({"ready": True, "load_s": time.perf_counter() - started, "info": info}) + "\n")
    proto.flush()
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("quit"):
            break
        seconds, tokens = [], []
        for request in msg["requests"]:
            t0 = time.perf_counter()
            tokens += decode(request)
            seconds.append(time.perf_counter() - t0)
        proto.write(json.dumps({"seconds": seconds, "tokens": tokens}) + "\n")
        proto.flush()
    return 0


# ---------------------------------------------------------------------------------------------- measuring


def cpu_features() -> str:
    """The SIMD features that matter to int8 and fp32 GEMMs, from /proc/cpuinfo's flags."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        return "flags unknown"
    wanted = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile",
              "amx_int8", "amx_bf16")
    have = [f for f in wanted if f in flags]
    amx = "AMX" if "amx_tile" in flags else "no AMX"
    return f"{', '.join(have)}; {amx}"



def measure(workers: dict[str, Worker], sentences: list[list[int]], sizes: list[int], rounds: int,
            log) -> tuple[dict, dict]:
    """rows[(engine, size)] and each engine's tokens per size."""
    rows, tokens = {}, {}
    names = list(workers)
    for size in sizes:
        requests = batches_of(sentences, size)
        per_request: dict[str, list[float]] = {e: [] for e in names}
        per_round: dict[str, list[float]] = {e: [] for e in names}
        log(f"{size} sentences per request ({len(requests)} requests): warm-up")
        for e in names:
            workers[e].call({"requests": requests[:1]})
        for r in range(rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            log(f"{size} sentences per request: round {r + 1}/{rounds} ({', '.join(order)})")
            for e in order:
                reply = workers[e].call({"requests": requests})
                per_request[e] += reply["seconds"]
                per_round[e].append(sum(reply["seconds"]))
                tokens[e, size] = reply["tokens"]
        for e in names:
            lengths = [len(t) for t in tokens[e, size]]
            median_round = statistics.median(per_round[e])
            rows[e, size] = {"engine": e, "sentences_per_request": size, "requests": len(requests),
                             "request_s": per_request[e], "round_s": per_round[e], "median_round_s": median_round,
                             "median_request_ms": 1000 * statistics.median(per_request[e]),
                             "sentences_per_s": len(sentences) / median_round,
                             "tokens_per_s": sum(lengths) / median_round, "tokens": sum(lengths),
                             "mean_length": statistics.mean(lengths), "min_length": min(lengths),
                             "max_length": max(lengths)}
    return rows, tokens


def speedups(rows: dict, tokens: dict, sizes: list[int]) -> list[dict]:
    out = []
    for ours, theirs, targets in PAIRS:
        for size in sizes:
            a, b = rows.get((ours, size)), rows.get((theirs, size))
            if a is None or b is None:
                continue
            ratio = b["median_round_s"] / a["median_round_s"]
            same = sum(x == y for x, y in zip(tokens[ours, size], tokens[theirs, size]))
            target = targets.get(size)
            out.append({"twostep": ours, "ctranslate2": theirs, "sentences_per_request": size, "speedup": ratio,
                        "tokens_per_s_ratio": a["tokens_per_s"] / b["tokens_per_s"], "same_tokens": same,
                        "sentences": len(tokens[ours, size]), "target": target,
                        "met": None if target is None else ratio >= target})
    return out


def report(meta: dict, rows: dict, engines: list[str], sizes: list[int], ratios: list[dict]) -> str:
    lines = [f"CPU: {meta['cpu']} ({meta['cpu_features']}), {meta['cores']} cores; {meta['threads']} intra-op "
             f"threads per engine; beam {BEAM}, length_penalty {LENGTH_PENALTY}, at most {meta['new_tokens']} "
             f"tokens; medians of {meta['rounds']} rounds (engines rotated) after a warm-up request; {meta['date']}; "
             f"load average before/after {meta['load_average']['before']}/{meta['load_average']['after']}",
             "", "| sentences per request | engine | median request ms | sentences/s | tokens/s | tokens per sentence "
             "(min-max) | at the cap |", "|---:|---|---:|---:|---:|---|---:|"]
    for size in sizes:
        for e in engines:
            r = rows.get((e, size))
            if r is None:
                continue
            capped = sum(n >= meta["new_tokens"] for n in meta["lengths"][f"{e}/{size}"])
            lines.append(f"| {size} | {LABELS[e]} | {r['median_request_ms']:,.0f} | {r['sentences_per_s']:.1f} | "
                         f"{r['tokens_per_s']:,.0f} | {r['mean_length']:.1f} ({r['min_length']}-{r['max_length']}) | "
                         f"{capped} |")
    if ratios:
        lines += ["", "| twostep vs CTranslate2 | sentences per request | speedup (time) | tokens/s ratio | "
                  "same tokens | target | met |", "|---|---:|---:|---:|---:|---:|---|"]
        for s in ratios:
            target = "-" if s["target"] is None else f"{s['target']:.1f}x"
            met = "-" if s["met"] is None else ("yes" if s["met"] else "NO")
            lines.append(f"| {LABELS[s['twostep']]} vs {LABELS[s['ctranslate2']]} | {s['sentences_per_request']} | "
                         f"{s['speedup']:.2f}x | {s['tokens_per_s_ratio']:.2f}x | {s['same_tokens']}/{s['sentences']} "
                         f"| {target} | {met} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, help="model files are built here once and reused (default: a temp dir)")
    p.add_argument("--sentences", default=None, help="sentences per request, comma-separated (default 1,8,32)")
    p.add_argument("--new-tokens", type=int, default=64, help="the cap on tokens per sentence, both engines")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 3; --smoke 1)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    p.add_argument("--markdown", type=Path, help="write the tables here")
    p.add_argument("--json", type=Path, help="write every number here")
    p.add_argument("--smoke", action="store_true", help="a tiny model, 8 sentences, 1 round: seconds")
    p.add_argument("--prepare-only", action="store_true", help="build and convert the models into --work, then stop")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(json.loads(args.worker))

    model = SMOKE if args.smoke else FULL
    sizes = [int(s) for s in (args.sentences or ("1,8" if args.smoke else "1,8,32")).split(",") if s.strip()]
    rounds = args.rounds or (1 if args.smoke else 3)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if set(engines) - set(ENGINES):
        p.error(f"unknown engines {sorted(set(engines) - set(ENGINES))}; choose from {', '.join(ENGINES)}")

    def log(msg: str) -> None:
        print(f"[argos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    work = (args.work or Path(tempfile.mkdtemp(prefix="twostep-argos-"))) / model.name
    (work / "logs").mkdir(parents=True, exist_ok=True)
    sentences = make_sentences(model)
    paths = prepare(work, model, sentences, engines, log)
    if args.prepare_only:
        log(f"prepared {work}")
        return 0

    load_before = load_average()
    workers: dict[str, Worker] = {}
    try:
        for e in engines:
            kind = e.split("-")[0]
            spec = {"kind": kind, "path": str(paths[e]), "threads": args.threads, "new_tokens": args.new_tokens,
                    "batch_type": "examples" if e.endswith("examples") else "tokens",
                    "compute_type": "float32" if e == "ct2-fp32" else "auto"}
            log(f"loading {e}")
            workers[e] = Worker(e, sys.executable, spec, work / "logs" / f"{e}.log", module="benchmarks.argos")
        rows, tokens = measure(workers, sentences, sizes, rounds, log)
    finally:
        for worker in workers.values():
            worker.close()

    ratios = speedups(rows, tokens, sizes)
    meta = {"cpu": cpu_model(), "cpu_features": cpu_features(), "cores": os.cpu_count(), "threads": args.threads,
            "new_tokens": args.new_tokens, "rounds": rounds, "date": time.strftime("%Y-%m-%d %H:%M"),
            "model": {**asdict(model), "size": asdict(model.size)}, "python": sys.version.split()[0],
            "engines": {e: w.info for e, w in workers.items()},
            "eos_fit": json.loads((paths["ckpt"].parent / "eos_fit.json").read_text()),
            "lengths": {f"{e}/{size}": [len(t) for t in tokens[e, size]] for e, size in tokens},
            "command": " ".join(["python -m benchmarks.argos", *(argv if argv is not None else sys.argv[1:])]),
            "work": str(work), "load_average": {"before": load_before, "after": load_average()}}
    table = report(meta, rows, engines, sizes, ratios)
    versions_line = "engines: " + "; ".join(f"{e}: {', '.join(f'{k} {v}' for k, v in info.items())}"
                                            for e, info in meta["engines"].items())
    print(table + "\n\n" + versions_line)
    if args.markdown:
        args.markdown.write_text(table + "\n\n" + versions_line + "\n")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": list(rows.values()), "speedups": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
