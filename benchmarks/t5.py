"""An mT5 model at mT5-base's size through twostep, CTranslate2 and Optimum, side by side in one run, with each
engine's export time and, at batch 1, how far each decoder step is from the time it takes to read its weights.

    python -m benchmarks.t5 [--work DIR] [--engines twostep-fp32,twostep-int8,ct2-fp32,ct2-int8,optimum]
                            [--workloads greedy-b1,greedy,beam] [--sentences 32] [--sentences-b1 8]
                            [--new-tokens 32] [--iters 3] [--threads 2] [--optimum-venv DIR] [--no-install]
                            [--no-reference] [--prepare-only] [--json OUT] [--markdown OUT] [--smoke]

The model: transformers' MT5ForConditionalGeneration (model_type "mt5") with random weights at mT5-base's size:
d_model 768, 12 encoder and 12 decoder layers, 12 heads of d_kv 64, d_ff 2048 gated-gelu, relative position
buckets 32 (max distance 128), an embedding of 250,112 rows shared by encoder and decoder and a separate lm_head
(tie_word_embeddings false, as mT5's config.json has it), `torch.manual_seed(0)`, transformers' init (the lm_head,
untied, normal with std 1 as T5's init gives an untied head). transformers 5 forces tie_word_embeddings to true
in MT5Config and ties a freshly built model's lm_head to the embedding; the benchmark gives the head its own
weights, saves them, and writes tie_word_embeddings false into config.json, as mT5's directories on the hub are:
transformers 5 then loads the head untied (both tensors are in the file and differ), transformers 4 reads the
flag. The head's weights are normal with std d_model^-0.5 (`--head-std`), which gives logits of about unit
scale: at T5's own init for an untied head (std 1: logits of std ~28 from the final norm's unit-RMS states),
`twostep export` refuses the model: its fp32 parity check (|a - b| <= 1e-4 + 1e-4 |b| on every logit) fails
with max errors ~2e-4 on the decoders' logits, float32 rounding over 768-term dot products of that size.
The tokenizer: a T5Tokenizer (Unigram) of mT5's layout, <pad> 0, </s> 1, <unk> 2, 249,997 made-up pieces,
<extra_id_99>..<extra_id_0>: 250,100 ids below the embedding's 250,112 rows (mT5's 12 padding rows). The engines
take token ids, so the pieces are names only. Sources: random ordinary pieces (10-40 of them) then </s>; the
decoder starts from <pad>.

Random weights never end a sentence, and they need not: every engine generates exactly `--new-tokens` tokens
(eos suppressed: twostep `suppress_eos`, CTranslate2 `min_decoding_length = max_decoding_length`,
transformers/Optimum `min_new_tokens = max_new_tokens`).

The engines, each in its own worker process (benchmarks/marian.py's Worker), `--threads` intra-op threads, one
inter-op thread:

- twostep fp32 / int8: `twostep import HF_DIR --out CKPT`, `twostep export CKPT --out ART --dtype fp32|int8`,
  decoded by `open_translator(ART, threads=...)` (ort-cpu) and `Translator.translate_ids`.
- CTranslate2 fp32 / int8: `ctranslate2.converters.TransformersConverter(HF_DIR).convert(OUT,
  quantization=None|"int8")`, `Translator(device="cpu", compute_type="default", inter_threads=1,
  intra_threads=threads)`, `translate_batch` on token names. CTranslate2 4.8.5's T5 loader scales the decoder's
  output by d_model^-0.5 whenever `config.tie_word_embeddings` is true, which transformers 5 makes it always; so
  the conversion (in a child process) gives the loaded model's config `tie_word_embeddings =
  config.scale_decoder_outputs` (T5: what transformers 5 computes from the saved flag; mT5: false, as transformers
  5's MT5 never scales), the logits transformers computes. (Greedy tokens are the same either way; beam search's
  are not.) Its vocabulary names the 12 padding rows <extra_id_0>..<extra_id_11> again, after the tokenizer's
  ids: a generated padding row comes back as the tokenizer's id of that name (the comparisons below map every
  engine's padding-row ids so).
- Optimum: `optimum-cli export onnx --model HF_DIR --task text2text-generation-with-past OUT` (its defaults:
  the outputs validated against PyTorch, the decoders also merged), loaded with
  `ORTModelForSeq2SeqLM.from_pretrained(OUT, use_merged=False, session_options=intra_op threads, inter_op 1,
  provider="CPUExecutionProvider")` (the encoder, the decoder and the decoder-with-past) and driven by
  transformers' `generate`, torch on `--threads` threads. optimum-onnx 0.1.0 (the latest) needs transformers
  < 4.58 and optimum ~= 2.1, so Optimum runs under its own venv, `--optimum-venv` (default
  ~/.cache/twostep-bench/optimum-venv), made when absent (unless `--no-install`: then its rows are reported as
  not run) as `python -m venv` and `pip install -c constraints.txt torch==2.13.0 optimum-onnx[onnxruntime]==0.1.0
  optimum==2.1.0 transformers==4.57.6 onnxruntime==<this interpreter's>`.
- transformers eager fp32 (this interpreter's): the token reference, once per --work (`--no-reference`: none).

Export times: each conversion is the command a user runs, in a fresh process, wall clock, measured when the
benchmark builds it (kept in WORK/export_times.json and reported again by later runs that reuse the files):
twostep import, twostep export fp32 and int8, CTranslate2's conversions, Optimum's export. The ratio: (twostep
import + export fp32) / Optimum's export, against the target 1.2x. Both check what they wrote: twostep export
against eager PyTorch on its shape grid (22 cases and two decoding sessions; about half its time at mT5-base's
size), optimum-cli on one set of dummy inputs per graph, after merging the two decoders into a third file.

Workloads: greedy batch 1 (`--sentences-b1` sentences), greedy batch 16 and beam 4 batch 8 (`--sentences`, the
same batches for every engine). Each engine is warmed up on a workload's first batch, then the workload runs
`--iters` rounds, the engines' order rotated each round; reported: the median milliseconds per batch over every
batch of every round, tokens/s over the median round, and speedups = the other engine's median ms / twostep's
(twostep fp32 vs CTranslate2 fp32 and vs Optimum, twostep int8 vs CTranslate2 int8); tokens identical to eager
transformers' (and to twostep's).

The weight-read floor at batch 1: every decoder step reads the decoder layers' weights (self-attention q, k, v,
o; cross-attention q, o, its k and v being computed once per sentence; the gated FFN's wi_0, wi_1, wo; the norms)
and the lm_head, at 4 bytes a weight (fp32) or 1 (int8, plus a 4-byte scale a row). That, over the memory
bandwidth measured here (`--threads` threads each copying its share of a 512 MiB float32 array with numpy,
counted as the bytes read plus written, best of 5), is the least time a step can take; each engine's ms per
token at batch 1 (its median ms per batch / new tokens; the encoder's one pass over the source is counted in)
is given as a multiple of it.

Run it on an otherwise idle machine (the load average before and after timing is printed). `--prepare-only`
builds everything (the model, the conversions and exports, the reference). `--smoke`: a tiny model (d_model 32,
2+2 layers, 312 rows), 4 sentences, 8 new tokens, 1 round: seconds, for the test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# Only the standard library at module level (benchmarks.marian's too): the Optimum worker runs this file under
# Optimum's venv.
from benchmarks.marian import Worker, batches_of, cpu_model, load_average, twostep_cli, versions

REPO = Path(__file__).resolve().parents[1]
ENGINES = ("twostep-fp32", "twostep-int8", "ct2-fp32", "ct2-int8", "optimum")
LABELS = {"twostep-fp32": "twostep fp32 (ort-cpu)", "twostep-int8": "twostep int8 (ort-cpu)",
          "ct2-fp32": "CTranslate2 fp32", "ct2-int8": "CTranslate2 int8", "optimum": "Optimum ORT fp32",
          "transformers": "transformers eager fp32"}
DTYPE = {"twostep-fp32": "fp32", "twostep-int8": "int8", "ct2-fp32": "fp32", "ct2-int8": "int8", "optimum": "fp32",
         "transformers": "fp32"}
PAIRS = (("twostep-fp32", "ct2-fp32"), ("twostep-fp32", "optimum"), ("twostep-int8", "ct2-int8"))
EXPORT_TARGET = 1.2  # (twostep import + export fp32) / Optimum's export, at most

OPTIMUM_VERSIONS = {"optimum-onnx": "0.1.0", "optimum": "2.1.0", "transformers": "4.57.6", "torch": "2.13.0"}
DEFAULT_OPTIMUM_VENV = Path.home() / ".cache" / "twostep-bench" / "optimum-venv"
PAD, EOS, UNK = 0, 1, 2  # T5's ids; the decoder starts from <pad>
EXTRA_IDS = 100


@dataclass(frozen=True)
class Size:
    name: str
    rows: int  # the embedding's and the lm_head's rows (config.json's vocab_size)
    pieces: int  # the tokenizer's ids before the extra ids: <pad> </s> <unk> and the pieces
    d_model: int
    d_kv: int
    heads: int
    layers: int
    d_ff: int

    @property
    def tokenizer_ids(self) -> int:
        return self.pieces + EXTRA_IDS


BASE = Size("mt5-base", 250112, 250000, 768, 64, 12, 12, 2048)  # google/mt5-base's
SMOKE = Size("smoke", 312, 200, 32, 8, 4, 2, 64)


@dataclass(frozen=True)
class Workload:
    key: str
    name: str
    batch: int
    beam: int
    n_sentences: int


# ---------------------------------------------------------------------------------------------- the model


def build_hf_model(out: Path, size: Size, seed: int = 0, head_std: float | None = None) -> Path:
    """A random-weight mT5 directory (see the module docstring), written to out; the lm_head's weights normal with
    std `head_std` (None: d_model ** -0.5)."""
    import torch
    from transformers import GenerationConfig, MT5Config, MT5ForConditionalGeneration, T5Tokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        config = MT5Config(vocab_size=size.rows, d_model=size.d_model, d_kv=size.d_kv, d_ff=size.d_ff,
                           num_layers=size.layers, num_decoder_layers=size.layers, num_heads=size.heads,
                           feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0,
                           pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD)
        torch.manual_seed(seed)
        model = MT5ForConditionalGeneration(config).eval()
        std = size.d_model ** -0.5 if head_std is None else head_std
        with torch.no_grad():  # transformers 5 tied it to the embedding: a weight of its own
            model.lm_head.weight = torch.nn.Parameter(torch.empty(size.rows, size.d_model).normal_(0.0, std))
        model.generation_config = GenerationConfig(decoder_start_token_id=PAD, pad_token_id=PAD, eos_token_id=EOS)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
    finally:
        torch.set_num_threads(threads)
    config_file = tmp / "config.json"
    saved = json.loads(config_file.read_text())
    saved["tie_word_embeddings"] = False  # as mT5 ships it (transformers 5 wrote its forced true)
    config_file.write_text(json.dumps(saved, indent=2) + "\n")
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(f"\u2581t{i}", -1.0 - i / size.pieces) for i in range(3, size.pieces)]
    vocab += [(f"<extra_id_{i}>", 0.0) for i in range(EXTRA_IDS - 1, -1, -1)]
    tokenizer = T5Tokenizer(vocab=vocab, extra_ids=EXTRA_IDS)
    if len(tokenizer) != size.tokenizer_ids:
        raise RuntimeError(f"the tokenizer has {len(tokenizer)} ids, expected {size.tokenizer_ids}")
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def make_sentences(n: int, size: Size, seed: int = 0, lengths: tuple[int, int] = (10, 40)) -> list[list[int]]:
    """n sources: 10..40 random ordinary pieces (no <pad>, </s>, <unk> or extra id), then </s>."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, size.pieces) for _ in range(rng.randint(*lengths))] + [EOS] for _ in range(n)]


def canonical(tokens: list[list[int]], size: Size) -> list[list[int]]:
    """A padding row's id (>= the tokenizer's ids) as the tokenizer's id of the name CTranslate2 gives it: row
    tokenizer_ids + k is <extra_id_k>, whose tokenizer id is tokenizer_ids - 1 - k."""
    n = size.tokenizer_ids
    return [[i if i < n else n - 1 - (i - n) for i in t] for t in tokens]


# ---------------------------------------------------------------------------------------------- preparation


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def optimum_installed(venv: Path) -> bool:
    python = python_of(venv)
    return python.is_file() and subprocess.run(
        [str(python), "-c", "import importlib.metadata as m, optimum.onnxruntime; "
         f"assert m.version('optimum-onnx') == {OPTIMUM_VERSIONS['optimum-onnx']!r}"],
        capture_output=True).returncode == 0


def optimum_requirements() -> list[str]:
    """What the venv installs: optimum-onnx's latest and what it needs, ONNX Runtime as this interpreter's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ort = [f"onnxruntime=={version('onnxruntime')}"]
    except PackageNotFoundError:
        ort = []
    return [f"torch=={OPTIMUM_VERSIONS['torch']}", f"optimum-onnx[onnxruntime]=={OPTIMUM_VERSIONS['optimum-onnx']}",
            f"optimum=={OPTIMUM_VERSIONS['optimum']}", f"transformers=={OPTIMUM_VERSIONS['transformers']}", *ort]


def install_optimum(venv: Path, log) -> None:
    """`python -m venv` and pip install optimum-onnx with torch's CPU build (the repository's constraints)."""
    log(f"installing Optimum into {venv}: {' '.join(optimum_requirements())}")
    venv.parent.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)
    for cmd, what in (([base, "-m", "venv", str(venv)], "python -m venv"),
                      ([str(python_of(venv)), "-m", "pip", "install", "--quiet", "-c", str(REPO / "constraints.txt"),
                        *optimum_requirements()], "pip install optimum-onnx")):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{what} failed:\n{(proc.stderr or proc.stdout)[-3000:]}")


def timed(cmd: list[str], log_path: Path, env: dict | None = None) -> float:
    """Run cmd (a fresh process) to its end; its wall-clock seconds. Output appended to log_path."""
    started = time.perf_counter()
    with open(log_path, "a") as out:
        out.write(f"$ {' '.join(map(str, cmd))}\n")
        out.flush()
        proc = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"{' '.join(map(str, cmd[:4]))} ... failed (exit {proc.returncode}); {log_path}:\n{tail}")
    return seconds


def ct2_convert(hf_dir: str, out_dir: str, quantization: str | None) -> None:
    """CTranslate2's TransformersConverter, the model's logits as transformers computes them (module docstring)."""
    from ctranslate2.converters import TransformersConverter

    class Converter(TransformersConverter):
        def load_model(self, model_class, model_name_or_path, **kwargs):
            model = super().load_model(model_class, model_name_or_path, **kwargs)
            model.config.tie_word_embeddings = bool(getattr(model.config, "scale_decoder_outputs", False))
            return model

    Converter(hf_dir).convert(out_dir, quantization=quantization, force=True)


def prepare(work: Path, size: Size, engines: list[str], optimum_python: str | None, optimum_error: str | None,
            log, rebuild: tuple[str, ...] = (), head_std: float | None = None
            ) -> tuple[dict[str, Path], dict[str, str], dict[str, dict]]:
    """Build (or reuse) every engine's files under work: (paths, errors by engine, export times by step: seconds
    and the load average before and after). `rebuild`: steps whose outputs are removed first, so built and timed
    again."""
    paths = {"hf": work / "hf", "ckpt": work / "twostep-ckpt", "twostep-fp32": work / "twostep-fp32",
             "twostep-int8": work / "twostep-int8", "twostep-int4": work / "twostep-int4",
             "ct2-fp32": work / "ct2-fp32", "ct2-int8": work / "ct2-int8", "optimum": work / "optimum-onnx"}
    errors: dict[str, str] = {}
    times_file = work / "export_times.json"
    times: dict[str, dict] = json.loads(times_file.read_text()) if times_file.is_file() else {}
    logs = work / "logs"
    for step in rebuild:  # built again, and timed again
        shutil.rmtree(paths["ckpt" if step == "twostep-import" else step], ignore_errors=True)

    def save_time(step: str, run) -> None:
        before = load_average()
        seconds = run()
        times[step] = {"seconds": seconds, "load_before": before, "load_after": load_average(),
                       "date": time.strftime("%Y-%m-%d %H:%M")}
        times_file.write_text(json.dumps(times, indent=2))
        log(f"{step}: {seconds:.1f} s (load average {before} before, {times[step]['load_after']} after)")

    if not (paths["hf"] / "config.json").is_file():
        log(f"building the random {size.name} model in {paths['hf']}")
        started = time.perf_counter()
        build_hf_model(paths["hf"], size, head_std=head_std)
        log(f"built in {time.perf_counter() - started:.0f} s")

    if any(e.startswith("twostep") for e in engines):
        try:
            if not (paths["ckpt"] / "model.safetensors").is_file():
                log("twostep import")
                save_time("twostep-import", lambda: timed(twostep_cli("import", paths["hf"], "--out", paths["ckpt"],
                                                                      "--force"), logs / "twostep-import.log"))
            for dtype in ("fp32", "int8", "int4"):  # int4: benchmarks/int4.py's
                key = f"twostep-{dtype}"
                if key in engines and not (paths[key] / "manifest.json").is_file():
                    log(f"twostep export --dtype {dtype}")
                    save_time(key, lambda: timed(twostep_cli("export", paths["ckpt"], "--out", paths[key], "--dtype",
                                                             dtype, "--force"), logs / f"{key}-export.log"))
        except RuntimeError as exc:
            for e in engines:
                if e.startswith("twostep") and not (paths[e] / "manifest.json").is_file():
                    errors[e] = str(exc)

    for dtype, quantization in (("fp32", None), ("int8", "int8")):
        key = f"ct2-{dtype}"
        if key not in engines or (paths[key] / "model.bin").is_file():
            continue
        log(f"CTranslate2 conversion, quantization {quantization or 'none (float32)'}")
        try:
            save_time(key, lambda: timed([sys.executable, "-m", "benchmarks.t5", "--ct2-convert", paths["hf"],
                                          paths[key], quantization or "none"], logs / f"{key}-convert.log"))
        except RuntimeError as exc:
            errors[key] = str(exc)

    if "optimum" in engines:
        if optimum_python is None:
            errors["optimum"] = optimum_error or "no Optimum venv"
        elif not (paths["optimum"] / "decoder_with_past_model.onnx").is_file():
            cli = Path(optimum_python).with_name("optimum-cli")
            tmp = paths["optimum"].with_name(paths["optimum"].name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            log(f"Optimum export ({cli} export onnx --task text2text-generation-with-past)")
            def export() -> float:
                seconds = timed([cli, "export", "onnx", "--model", paths["hf"], "--task",
                                 "text2text-generation-with-past", tmp], logs / "optimum-export.log")
                shutil.rmtree(paths["optimum"], ignore_errors=True)
                tmp.rename(paths["optimum"])
                return seconds

            try:
                save_time("optimum", export)
            except (RuntimeError, OSError) as exc:
                errors["optimum"] = str(exc)
    return paths, errors, times


# ---------------------------------------------------------------------------------------------- the engines
# Each returns decode(batch of source id lists, beam) -> the best hypothesis' ids per sentence (without the decoder
# start), and the versions of what it runs on. They run inside a worker process (worker_main).


def twostep_engine(spec: dict):
    from twostep.runtime.decoding import DecodeOptions
    from twostep.runtime.translator import open_translator

    n = spec["new_tokens"]
    options = {b: DecodeOptions(beam_size=b, max_new_tokens=n, suppress_eos=True) for b in (1, spec["max_beam"])}
    translator, backend = open_translator(Path(spec["path"]), batch_size=spec["max_batch"],
                                          options=options[spec["max_beam"]], threads=spec["threads"])

    def decode(batch, beam):
        return translator.translate_ids(batch, options[beam])

    info = versions("onnxruntime", "numpy")
    info["backend"] = f"{backend.name}, decoder {getattr(backend, 'decoder', '?')}"
    return decode, info


def ct2_engine(spec: dict):
    import ctranslate2

    n = spec["new_tokens"]
    translator = ctranslate2.Translator(spec["path"], device="cpu", compute_type="default", inter_threads=1,
                                        intra_threads=spec["threads"])
    names = json.loads((Path(spec["path"]) / "shared_vocabulary.json").read_text())
    ids: dict[str, int] = {}
    for i, name in enumerate(names):
        ids.setdefault(name, i)  # the padding rows' repeated <extra_id_k> names: the tokenizer's id

    def decode(batch, beam):
        results = translator.translate_batch([[names[i] for i in s] for s in batch], beam_size=beam,
                                             max_input_length=0, max_decoding_length=n, min_decoding_length=n,
                                             length_penalty=1.0)
        return [[ids[t] for t in r.hypotheses[0]] for r in results]

    info = versions("ctranslate2")
    info["compute_type"] = translator.compute_type
    return decode, info


def hf_generate(model, spec: dict):
    """decode() over transformers' generate (eager transformers or Optimum's ORTModelForSeq2SeqLM): exactly
    new_tokens tokens, eos suppressed until then, nothing else."""
    import torch

    n = spec["new_tokens"]

    def decode(batch, beam):
        width = max(len(s) for s in batch)
        ids = torch.tensor([s + [PAD] * (width - len(s)) for s in batch])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in batch])
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, num_beams=beam, do_sample=False,
                                 max_new_tokens=n, min_new_tokens=n, length_penalty=1.0, num_return_sequences=1,
                                 early_stopping=False)
        return [row[1:].tolist() for row in out]  # without the decoder start

    return decode


def optimum_engine(spec: dict):
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    torch.set_num_threads(spec["threads"])  # generate's logits processing and beam bookkeeping run in torch
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = spec["threads"], 1
    model = ORTModelForSeq2SeqLM.from_pretrained(spec["path"], use_merged=False, session_options=options,
                                                 provider="CPUExecutionProvider")
    info = versions("optimum", "optimum-onnx", "onnxruntime", "transformers", "torch")
    info["decoder"] = "merged" if getattr(model.decoder, "is_merged", False) else "decoder + decoder_with_past"
    return hf_generate(model, spec), info


def transformers_engine(spec: dict):
    import torch
    from transformers import MT5ForConditionalGeneration

    torch.set_num_threads(spec["threads"])
    model = MT5ForConditionalGeneration.from_pretrained(spec["path"]).eval()
    return hf_generate(model, spec), versions("transformers", "torch")


FACTORIES = {"twostep": twostep_engine, "ct2": ct2_engine, "optimum": optimum_engine,
             "transformers": transformers_engine}


def worker_main(spec: dict) -> int:
    """Serve one engine over stdin/stdout, one JSON line each way: {"batches": [...], "beam": k} -> each batch's
    seconds and each sentence's tokens. Whatever the libraries print goes to stderr, not into the protocol."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    started = time.perf_counter()
    decode, info = FACTORIES[spec["kind"]](spec)
    proto.write(json.dumps({"ready": True, "load_s": time.perf_counter() - started, "info": info}) + "\n")
    proto.flush()
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("quit"):
            break
        seconds, tokens = [], []
        for batch in msg["batches"]:
            t0 = time.perf_counter()
            tokens += decode(batch, msg["beam"])
            seconds.append(time.perf_counter() - t0)
        proto.write(json.dumps({"seconds": seconds, "tokens": tokens}) + "\n")
        proto.flush()
    return 0


# ---------------------------------------------------------------------------------------------- the floor


def memory_bandwidth(threads: int, mib: int = 512, repeats: int = 5) -> dict:
    """Bytes per second of a numpy copy of a `mib` MiB float32 array, `threads` threads each copying its share
    (numpy releases the GIL), counted as bytes read plus written; best of `repeats`. Also one thread's."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    n = mib * 2**20 // 4
    src = np.ones(n, dtype=np.float32)
    dst = np.zeros(n, dtype=np.float32)

    def best(k: int) -> float:
        cuts = np.linspace(0, n, k + 1).astype(int)
        parts = [(dst[a:b], src[a:b]) for a, b in zip(cuts, cuts[1:])]
        times = []
        with ThreadPoolExecutor(k) as pool:
            for _ in range(repeats):
                t0 = time.perf_counter()
                list(pool.map(lambda p: np.copyto(*p), parts))
                times.append(time.perf_counter() - t0)
        return 2 * src.nbytes / min(times)

    return {"bytes_per_s": best(threads), "one_thread_bytes_per_s": best(1), "threads": threads, "array_mib": mib}


def step_weight_bytes(size: Size, dtype: str) -> dict:
    """The weights one decoder step reads at batch 1 (module docstring), by part, and their bytes."""
    inner = size.heads * size.d_kv
    per_layer = {"self-attention q k v o": 4 * size.d_model * inner, "cross-attention q o": 2 * size.d_model * inner,
                 "gated FFN wi_0 wi_1 wo": 3 * size.d_model * size.d_ff}
    matrices = {k: v * size.layers for k, v in per_layer.items()}
    matrices["lm_head"] = size.rows * size.d_model
    rows = size.layers * (4 * inner + 3 * size.d_model + 2 * size.d_ff) + size.rows  # each matrix's output rows
    norms = (3 * size.layers + 1) * size.d_model  # fp32 in every engine
    if dtype == "int8":
        total = sum(matrices.values()) + 4 * rows + 4 * norms
    else:
        total = 4 * (sum(matrices.values()) + norms)
    return {"weights": {**matrices, "norms": norms}, "bytes": total, "dtype": dtype}


# ---------------------------------------------------------------------------------------------- measuring


def identical(a: list[list[int]], b: list[list[int]]) -> int:
    return sum(x == y for x, y in zip(a, b))


def measure(workers: dict[str, Worker], sentences: list[list[int]], workloads: list[Workload], iters: int,
            new_tokens: int, size: Size, reference: dict | None, log) -> dict:
    rows: dict[tuple[str, str], dict] = {}
    names = list(workers)
    for w in workloads:
        batches = batches_of(sentences[: w.n_sentences], w.batch)
        per_batch: dict[str, list[float]] = {e: [] for e in names}
        per_round: dict[str, list[float]] = {e: [] for e in names}
        tokens: dict[str, list[list[int]]] = {}
        log(f"{w.name} ({len(batches)} batches): warm-up")
        for e in names:
            workers[e].call({"batches": batches[:1], "beam": w.beam})
        for r in range(iters):
            order = names[r % len(names):] + names[: r % len(names)]
            log(f"{w.name}: round {r + 1}/{iters} ({', '.join(order)})")
            for e in order:
                reply = workers[e].call({"batches": batches, "beam": w.beam})
                per_batch[e] += reply["seconds"]
                per_round[e].append(sum(reply["seconds"]))
                tokens[e] = canonical(reply["tokens"], size)
                time.sleep(0.2)  # ONNX Runtime's and OpenMP's pools spin a while after a run
        ref = None if reference is None else canonical(reference[str(w.beam)][: w.n_sentences], size)
        for e in names:
            lengths = [len(t) for t in tokens[e]]
            median_round = statistics.median(per_round[e])
            rows[e, w.key] = {
                "engine": e, "workload": w.name, "key": w.key, "batch": w.batch, "beam": w.beam,
                "sentences": w.n_sentences, "batches": len(batches), "batch_s": per_batch[e],
                "median_batch_ms": 1000 * statistics.median(per_batch[e]),
                "min_batch_ms": 1000 * min(per_batch[e]), "max_batch_ms": 1000 * max(per_batch[e]),
                "round_s": per_round[e], "tokens": sum(lengths), "tokens_per_s": sum(lengths) / median_round,
                "all_lengths_equal_new_tokens": all(n == new_tokens for n in lengths),
                "same_as_eager": None if ref is None else identical(tokens[e], ref),
                "same_as": {o: identical(tokens[e], tokens[o]) for o in names if o != e},
                "load_s": workers[e].load_s}
            if not rows[e, w.key]["all_lengths_equal_new_tokens"]:
                log(f"warning: {e} did not give {new_tokens} tokens for every sentence "
                    f"({min(lengths)}..{max(lengths)})")
    return rows


def speedup_rows(rows: dict, workloads: list[Workload]) -> list[dict]:
    out = []
    for ours, other in PAIRS:
        for w in workloads:
            a, b = rows.get((ours, w.key)), rows.get((other, w.key))
            if a is None or b is None:
                continue
            out.append({"twostep": ours, "other": other, "workload": w.name, "key": w.key,
                        "speedup": b["median_batch_ms"] / a["median_batch_ms"],
                        "same_tokens": a["same_as"].get(other), "sentences": a["sentences"]})
    return out


def floor_rows(rows: dict, size: Size, new_tokens: int, bandwidth: dict) -> list[dict]:
    out = []
    for (e, key), r in rows.items():
        if key != "greedy-b1":
            continue
        weights = step_weight_bytes(size, DTYPE[e])
        floor_ms = 1000 * weights["bytes"] / bandwidth["bytes_per_s"]
        per_token = r["median_batch_ms"] / new_tokens
        out.append({"engine": e, "dtype": DTYPE[e], "step_bytes": weights["bytes"], "floor_ms": floor_ms,
                    "ms_per_token": per_token, "times_floor": per_token / floor_ms})
    return out


def export_rows(times: dict[str, dict]) -> tuple[list[dict], dict | None]:
    order = ("twostep-import", "twostep-fp32", "twostep-int8", "ct2-fp32", "ct2-int8", "optimum")
    labels = {"twostep-import": "twostep import", "twostep-fp32": "twostep export --dtype fp32",
              "twostep-int8": "twostep export --dtype int8", "ct2-fp32": "CTranslate2 conversion (float32)",
              "ct2-int8": "CTranslate2 conversion (int8)",
              "optimum": "optimum-cli export onnx (text2text-generation-with-past)"}
    rows = [{"step": k, "label": labels[k], **times[k]} for k in order if k in times]
    ratio = None
    if "twostep-import" in times and "twostep-fp32" in times and "optimum" in times:
        total = times["twostep-import"]["seconds"] + times["twostep-fp32"]["seconds"]
        optimum = times["optimum"]["seconds"]
        ratio = {"twostep_fp32_total_s": total, "optimum_s": optimum, "ratio": total / optimum,
                 "target": EXPORT_TARGET, "met": total / optimum <= EXPORT_TARGET}
    return rows, ratio


def report(meta: dict, rows: dict, engines: list[str], workloads: list[Workload], errors: dict, speedups: list[dict],
           floors: list[dict], exports: list[dict], export_ratio: dict | None) -> str:
    bw = meta["bandwidth"]
    lines = [f"CPU: {meta['cpu']} ({meta['cores']} cores); {meta['threads']} threads per engine; "
             f"{meta['new_tokens']} new tokens per sentence; median ms per batch over {meta['iters']} rounds (engines "
             f"rotated) after a warm-up batch; {meta['date']}; load average before/after "
             f"{meta['load_average']['before']}/{meta['load_average']['after']}; model {meta['size']['name']} "
             f"(d_model {meta['size']['d_model']}, {meta['size']['layers']}+{meta['size']['layers']} layers, "
             f"{meta['size']['rows']:,} rows)",
             "", "| workload | engine | median ms/batch | min-max ms | tokens/s | = eager | load s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for w in workloads:
        for e in engines:
            r = rows.get((e, w.key))
            if r is None:
                continue
            same = "-" if r["same_as_eager"] is None else f"{r['same_as_eager']}/{r['sentences']}"
            lines.append(f"| {w.name} | {LABELS[e]} | {r['median_batch_ms']:,.0f} | {r['min_batch_ms']:,.0f}-"
                         f"{r['max_batch_ms']:,.0f} | {r['tokens_per_s']:,.1f} | {same} | {r['load_s']:.1f} |")
    for e, why in errors.items():
        lines.append(f"| all | {LABELS[e]} | not run: {why.strip().splitlines()[-1][:200]} | | | | |")  # its last line
    if speedups:
        lines += ["", "| speedup (other's ms / twostep's) | workload | speedup | same tokens |", "|---|---|---:|---:|"]
        for s in speedups:
            same = "-" if s["same_tokens"] is None else f"{s['same_tokens']}/{s['sentences']}"
            lines.append(f"| {LABELS[s['twostep']]} vs {LABELS[s['other']]} | {s['workload']} | {s['speedup']:.2f}x | "
                         f"{same} |")
    if floors:
        lines += ["", f"Weight-read floor at batch 1: memory bandwidth {bw['bytes_per_s'] / 1e9:.1f} GB/s "
                  f"({bw['threads']} threads copying {bw['array_mib']} MiB, read + written; one thread "
                  f"{bw['one_thread_bytes_per_s'] / 1e9:.1f} GB/s)", "",
                  "| engine | weights read per step | floor ms/step | measured ms/token | x floor |",
                  "|---|---:|---:|---:|---:|"]
        for f in floors:
            lines.append(f"| {LABELS[f['engine']]} | {f['step_bytes'] / 2**20:,.1f} MiB ({f['dtype']}) | "
                         f"{f['floor_ms']:.1f} | {f['ms_per_token']:.1f} | {f['times_floor']:.2f} |")
    if exports:
        lines += ["", "| export (a fresh process, wall clock) | seconds | load average before/after | when |",
                  "|---|---:|---|---|"]
        lines += [f"| {x['label']} | {x['seconds']:.1f} | {x.get('load_before')}/{x.get('load_after')} | "
                  f"{x.get('date', '?')} |" for x in exports]
        if export_ratio:
            lines.append(f"| twostep import + export fp32 / Optimum | {export_ratio['ratio']:.2f}x (target <= "
                         f"{export_ratio['target']:.1f}x: {'met' if export_ratio['met'] else 'NOT met'}) | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, help="model files are built here once and reused (default: a temp dir)")
    p.add_argument("--smoke", action="store_true", help="a tiny model, 4 sentences, 8 new tokens, 1 round: seconds")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}, "
                   "transformers (eager, as a timed engine too)")
    p.add_argument("--workloads", default="greedy-b1,greedy,beam", help="of greedy-b1, greedy (batch --batch), beam "
                   "(--beam, batch --beam-batch)")
    p.add_argument("--sentences", type=int, help="sentences of the batched workloads (default 32; --smoke 4)")
    p.add_argument("--sentences-b1", type=int, help="sentences of the batch-1 workload (default 8; --smoke 2)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--beam-batch", type=int, default=8)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--new-tokens", type=int, help="tokens generated per sentence, every engine (default 32; --smoke 8)")
    p.add_argument("--iters", type=int, help="timed rounds (default 3; --smoke 1)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--head-std", type=float, help="the lm_head's init std (default d_model ** -0.5; T5's own for an "
                   "untied head is 1.0); a model already built in --work is kept")
    p.add_argument("--optimum-venv", type=Path, default=DEFAULT_OPTIMUM_VENV, help="Optimum's own venv (made if "
                   "absent)")
    p.add_argument("--no-install", action="store_true", help="never make Optimum's venv: skip Optimum without it")
    p.add_argument("--no-reference", action="store_true", help="no eager transformers reference")
    p.add_argument("--bandwidth-mib", type=int, help="the bandwidth measure's array (default 512; --smoke 64)")
    p.add_argument("--rebuild", default="", help="comma-separated steps built (and timed) again though present: "
                   "twostep-import, twostep-fp32, twostep-int8, ct2-fp32, ct2-int8, optimum")
    p.add_argument("--prepare-only", action="store_true", help="build, convert and export into --work, then stop")
    p.add_argument("--json", type=Path, help="write every number here")
    p.add_argument("--markdown", type=Path, help="write the tables here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--ct2-convert", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(json.loads(args.worker))
    if args.ct2_convert:
        hf, out, quantization = args.ct2_convert
        ct2_convert(hf, out, None if quantization == "none" else quantization)
        return 0

    size = SMOKE if args.smoke else BASE
    n = args.sentences or (4 if args.smoke else 32)
    n1 = min(args.sentences_b1 or (2 if args.smoke else 8), n)
    new_tokens = args.new_tokens or (8 if args.smoke else 32)
    iters = args.iters or (1 if args.smoke else 3)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(engines) - set(ENGINES) - {"transformers"}
    if unknown:
        p.error(f"unknown engines {sorted(unknown)}; choose from {', '.join(ENGINES)}, transformers")
    all_workloads = {"greedy-b1": Workload("greedy-b1", "greedy batch 1", 1, 1, n1),
                     "greedy": Workload("greedy", f"greedy batch {args.batch}", args.batch, 1, n),
                     "beam": Workload("beam", f"beam {args.beam} batch {args.beam_batch}", args.beam_batch, args.beam,
                                      n)}
    keys = [k.strip() for k in args.workloads.split(",") if k.strip()]
    if set(keys) - set(all_workloads):
        p.error(f"unknown workloads {sorted(set(keys) - set(all_workloads))}; choose from greedy-b1, greedy, beam")
    workloads = [all_workloads[k] for k in keys]

    def log(msg: str) -> None:
        print(f"[t5 {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    work = (args.work or Path(tempfile.mkdtemp(prefix="twostep-t5-"))) / size.name
    (work / "logs").mkdir(parents=True, exist_ok=True)
    optimum_python, optimum_error = None, None
    if "optimum" in engines:
        if optimum_installed(args.optimum_venv):
            optimum_python = str(python_of(args.optimum_venv))
        elif args.no_install:
            optimum_error = (f"no optimum-onnx=={OPTIMUM_VERSIONS['optimum-onnx']} venv at {args.optimum_venv} "
                             "(--no-install); run without --no-install to make it")
        else:
            try:
                install_optimum(args.optimum_venv, log)
                optimum_python = str(python_of(args.optimum_venv))
            except (RuntimeError, OSError) as exc:
                optimum_error = f"installing Optimum failed: {exc}"
    rebuild = tuple(x.strip() for x in args.rebuild.split(",") if x.strip())
    if set(rebuild) - {"twostep-import", *ENGINES}:
        p.error(f"unknown --rebuild steps {sorted(set(rebuild) - {'twostep-import', *ENGINES})}")
    paths, errors, export_times = prepare(work, size, engines, optimum_python, optimum_error, log, rebuild,
                                          args.head_std)
    sentences = make_sentences(n, size)
    max_beam = max(w.beam for w in workloads)
    common = {"threads": args.threads, "new_tokens": new_tokens, "max_batch": max(args.batch, args.beam_batch),
              "max_beam": max_beam}

    def spec(engine: str) -> dict:
        path = paths["hf"] if engine == "transformers" else paths[engine]
        return {**common, "kind": engine.split("-")[0], "path": str(path)}

    reference = None
    if not args.no_reference:
        ref_file = work / f"reference-{n}x{new_tokens}-b{args.batch}-beam{args.beam}-b{args.beam_batch}.json"
        if ref_file.is_file():
            reference = json.loads(ref_file.read_text())
        else:
            log("eager transformers reference (greedy and beam)")
            worker = Worker("transformers", sys.executable, spec("transformers"), work / "logs" / "reference.log",
                            module="benchmarks.t5")
            try:
                reference = {str(beam): worker.call({"batches": batches_of(sentences, batch), "beam": beam})["tokens"]
                             for beam, batch in ((1, args.batch), (args.beam, args.beam_batch))}
            finally:
                worker.close()
            ref_file.write_text(json.dumps(reference))
    if args.prepare_only:
        for e, why in errors.items():
            log(f"{e} cannot run: {why}")
        log(f"prepared {work}")
        return 1 if errors else 0

    load_before = load_average()
    if load_before is not None and load_before > 0.5:
        log(f"warning: load average {load_before:.2f} before timing: something else is running")
    log("memory bandwidth")
    bandwidth = memory_bandwidth(args.threads, args.bandwidth_mib or (64 if args.smoke else 512))
    workers: dict[str, Worker] = {}
    try:
        for e in engines:
            if e in errors:
                continue
            python = optimum_python if e == "optimum" else sys.executable
            log(f"loading {e}")
            try:
                workers[e] = Worker(e, python, spec(e), work / "logs" / f"{e}.log", module="benchmarks.t5")
            except (RuntimeError, OSError) as exc:
                errors[e] = str(exc)
        rows = measure(workers, sentences, workloads, iters, new_tokens, size, reference, log) if workers else {}
    finally:
        for worker in workers.values():
            worker.close()
    load_after = load_average()

    speedups = speedup_rows(rows, workloads)
    floors = floor_rows(rows, size, new_tokens, bandwidth)
    exports, export_ratio = export_rows(export_times)
    meta = {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": args.threads, "new_tokens": new_tokens,
            "iters": iters, "date": time.strftime("%Y-%m-%d %H:%M"), "size": asdict(size),
            "python": sys.version.split()[0], "engines": {e: w.info for e, w in workers.items()},
            "bandwidth": bandwidth, "step_weights": {d: step_weight_bytes(size, d) for d in ("fp32", "int8")},
            "command": " ".join(["python -m benchmarks.t5", *(argv if argv is not None else sys.argv[1:])]),
            "work": str(work), "load_average": {"before": load_before, "after": load_after}}
    table = report(meta, rows, engines, workloads, errors, speedups, floors, exports, export_ratio)
    versions_line = "engine versions: " + "; ".join(f"{LABELS[e]}: {', '.join(f'{k} {v}' for k, v in info.items())}"
                                                    for e, info in meta["engines"].items())
    print(table + "\n\n" + versions_line)
    if args.markdown:
        args.markdown.write_text(table + "\n\n" + versions_line + "\n")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": list(rows.values()), "speedups": speedups,
                                         "floor": floors, "exports": exports, "export_ratio": export_ratio,
                                         "errors": errors}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
