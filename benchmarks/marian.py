"""A Marian model at OPUS-MT's size (or, `--family nllb`, an NLLB model at NLLB-200-distilled-600M's) through
twostep, CTranslate2 and Optimum, side by side in one run.

    python -m benchmarks.marian [--family marian|nllb] [--work DIR] [--iters 3] [--warmup 1] [--threads 2]
                                [--new-tokens N] [--batch N] [--beam-batch N] [--prepare-only]
                                [--engines twostep-fp32,twostep-int8,ct2-fp32,ct2-int8,optimum]
                                [--optimum-python PY] [--json OUT] [--markdown OUT] [--tiny]

The model: transformers' MarianMTModel with random weights at the size of the OPUS-MT models (d_model 512,
6+6 layers, 8 heads, ffn 2048, vocab 58101 with pad = decoder start = the last id and eos 0, swish, scaled and
shared embeddings tied to the output layer, sinusoidal positions), `torch.manual_seed(0)`, MarianConfig's
init_std 0.05 and a non-zero `final_logits_bias` (normal x 0.1). (At transformers' default init_std 0.02 every
source sentence decodes to the same token, repeated, which would make the token comparison below empty; at 0.05
sentences differ, though each still mostly repeats one token: random tied embeddings predict themselves.) The
directory is written with `save_pretrained` as OPUS-MT ships it: config.json, generation_config.json
(bad_words_ids [[pad]], no forced eos), model.safetensors and a MarianTokenizer (a small SentencePiece model
and a vocab.json of 58101 tokens; the engines take token ids, so it only has to be loadable: CTranslate2's
converter reads the vocabulary from it).

`--family nllb`: transformers' M2M100ForConditionalGeneration with random weights at NLLB-200-distilled-600M's
size (d_model 1024, 12+12 layers, 16 heads, ffn 4096, relu, scaled embeddings shared and tied, sinusoidal
positions, an embedding of 256,206 rows: 256,204 tokenizer ids and 2 padding rows, bos 0, pad 1, eos 2 = decoder
start) and an NllbTokenizer of 256,204 ids (a BPE vocabulary of 256,001 names without merges, NLLB's 202
language codes, <mask>) saved as tokenizer.json alone. Sources start with the source language code (eng_Latn)
and end with eos; every engine forces the target language code (fra_Latn) after the decoder start (twostep
`tgt_lang`, CTranslate2 `target_prefix`, transformers/Optimum `forced_bos_token_id`); the tokens compared and
counted are those after it. Workloads: greedy batch 1, greedy batch 16, beam 4 batch 8, 32 new tokens.

The engines, each in its own worker process, loaded once and then driven over a pipe:

- twostep fp32 / int8: `twostep import HF_DIR` then `twostep export` (int8: `--dtype int8`), decoded by the
  Python runtime on the artifact's default backend (ort-cpu, `threads`) through `open_translator` and
  `Translator.translate_ids`. The artifact's manifest carries Marian's decoder start and never-generated ids.
- CTranslate2 fp32 / int8: `ctranslate2.converters.TransformersConverter` (ct2-transformers-converter's API),
  `quantization=None` and `"int8"`; `Translator(device="cpu", inter_threads=1, intra_threads=threads)`,
  `translate_batch` on token strings (the converted vocabulary, as benchmarks/cpu.py drives it).
- Optimum: `ORTModelForSeq2SeqLM` (optimum-onnx), exported once from HF_DIR with its defaults (encoder,
  decoder and decoder-with-past, not merged) and loaded with `intra_op_num_threads=threads`, decoding with
  transformers' `generate`. optimum-onnx 0.1.0 (the latest) needs transformers < 4.58, so where Optimum is not
  importable in this interpreter it runs under `--optimum-python` (default /tmp/optimum-venv/bin/python, a
  venv with torch 2.13.0+cpu, transformers 4.57.6, optimum 2.1.0, optimum-onnx 0.1.0, onnxruntime 1.32.0:
  see docs/benchmarks.md); without either, the Optimum rows are reported as not run.
- transformers (eager PyTorch, fp32): the token reference, computed once; timed only if listed in --engines.

Every engine generates exactly `--new-tokens` tokens per sentence (EOS suppressed: twostep `suppress_eos`,
CTranslate2 `min_decoding_length = max_decoding_length`, transformers/Optimum `min_new_tokens =
max_new_tokens`) and never the pad id. The sources are random token ids (lengths 10..40, no special ids) plus
eos. Workloads: greedy batch 1 (the first --sentences-b1 sentences), greedy batch 32 and beam 4 batch 32 (all
--sentences, in batches of 32, the same batches for every engine). Each workload is warmed up once per engine,
then timed --iters times with the engines interleaved (A, B, C, A, B, C, ...), so that the machine's drift hits
all of them alike; the table gives median seconds for the whole workload and tokens/s, speedups (the other
engine's time / twostep's), and how many sentences' tokens are identical to eager transformers'.

Run it on an otherwise idle machine: with 2 threads per engine on 2 cores that something else keeps busy,
CTranslate2 fp32 slows by 5-10x (its threads wait on each other), the others by 1.2-3x. The load average
before and after timing is printed. `--prepare-only` builds everything (about 10-15 minutes, mostly the two
twostep exports) and computes the reference tokens, for a timed run later.
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
from dataclasses import dataclass
from pathlib import Path

# Only the standard library at module level: the Optimum worker runs this file under another interpreter.

ENGINES = ("twostep-fp32", "twostep-int8", "ct2-fp32", "ct2-int8", "optimum")
LABELS = {"twostep-fp32": "twostep fp32 (ort-cpu)", "twostep-int8": "twostep int8 (ort-cpu)",
          "ct2-fp32": "CTranslate2 fp32", "ct2-int8": "CTranslate2 int8", "optimum": "Optimum ORT fp32",
          "transformers": "transformers eager fp32"}
# twostep's engine, the other engine, the speedup the issue asks for (other's time / twostep's)
TARGETS = (("twostep-fp32", "ct2-fp32", 1.0), ("twostep-fp32", "optimum", 2.0), ("twostep-int8", "ct2-int8", 1.2))
DEFAULT_OPTIMUM_PYTHON = Path("/tmp/optimum-venv/bin/python")
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Size:
    name: str
    vocab: int
    d_model: int
    layers: int
    heads: int
    ffn: int
    max_positions: int
    init_std: float  # MarianConfig.init_std: the least at which different sources decode differently


BASE = Size("base", 58101, 512, 6, 8, 2048, 512, 0.05)  # OPUS-MT's (Helsinki-NLP/opus-mt-*)
TINY = Size("tiny", 100, 32, 2, 4, 64, 64, 0.3)  # the smoke test's
NLLB_600M = Size("600M", 256206, 1024, 12, 16, 4096, 1024, 0.05)  # NLLB-200-distilled-600M's
NLLB_TINY = Size("tiny", 300, 32, 2, 4, 64, 64, 0.3)  # 95 BPE names, 202 language codes, <mask>, 2 padding rows
NLLB_SRC_LANG, NLLB_TGT_LANG = "eng_Latn", "fra_Latn"
NLLB_PADDING_ROWS = 2  # the embedding's rows beyond the tokenizer's ids (256,206 - 256,204)


@dataclass(frozen=True)
class Family:
    """What differs between the model families: the model, its ids, the languages and the default workloads."""

    name: str
    base: Size
    tiny: Size
    hf_class: str  # the transformers class of the eager reference
    pad: int | None  # None: the last id
    eos: int
    first_id: int  # random source ids are drawn from first_id .. the pad (Marian) or the first language code
    src_lang: str | None  # its code starts every source (NLLB)
    tgt_lang: str | None  # its code is forced after the decoder start (NLLB)
    batch: int  # the greedy batch workload's
    beam_batch: int
    new_tokens: int

    def pad_id(self, size: Size) -> int:
        return size.vocab - 1 if self.pad is None else self.pad

    def first_code(self, size: Size) -> int:
        """NLLB: the id of the first language code (after bos, pad, eos, unk and the BPE names)."""
        return size.vocab - NLLB_PADDING_ROWS - 1 - len(nllb_codes())


def nllb_codes() -> list[str]:
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    return list(FAIRSEQ_LANGUAGE_CODES)


@dataclass(frozen=True)
class Workload:
    name: str
    batch: int
    beam: int
    n_sentences: int


# ---------------------------------------------------------------------------------------------- preparation


def build_hf_model(out: Path, size: Size, seed: int = 0) -> Path:
    """A random-weight MarianMTModel directory as OPUS-MT ships one (see the module docstring)."""
    import io

    import sentencepiece as spm
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    pad = size.vocab - 1
    config = MarianConfig(
        vocab_size=size.vocab, decoder_vocab_size=size.vocab, d_model=size.d_model, encoder_layers=size.layers,
        decoder_layers=size.layers, encoder_attention_heads=size.heads, decoder_attention_heads=size.heads,
        encoder_ffn_dim=size.ffn, decoder_ffn_dim=size.ffn, activation_function="swish", scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True, max_position_embeddings=size.max_positions,
        pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=None, init_std=size.init_std,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.1)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=pad, pad_token_id=pad, eos_token_id=0, bad_words_ids=[[pad]],
        forced_eos_token_id=None, max_length=size.max_positions, num_beams=1)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    # The tokenizer: a small SentencePiece model (the engines take ids, never text) and the full vocabulary.
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["the quick brown fox jumps over the lazy dog"] * 20),
                                   model_writer=buf, vocab_size=32, model_type="char", character_coverage=1.0,
                                   minloglevel=2)
    for name in ("source.spm", "target.spm"):
        (tmp / name).write_bytes(buf.getvalue())
    vocab = {"</s>": 0, "<unk>": 1, **{f"t{i}": i for i in range(2, pad)}, "<pad>": pad}
    (tmp / "vocab.json").write_text(json.dumps(vocab))
    MarianTokenizer(str(tmp / "source.spm"), str(tmp / "target.spm"), str(tmp / "vocab.json")).save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def build_nllb_model(out: Path, size: Size, seed: int = 0) -> Path:
    """A random-weight NLLB directory with NLLB's id layout (see the module docstring)."""
    import torch
    from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer

    codes = nllb_codes()
    names = size.vocab - NLLB_PADDING_ROWS - len(codes) - 1  # 256,001 at full size, as NLLB's
    # NLLB's order: the names, the codes, <mask> last (given alone, NllbTokenizer would put <mask> first)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{f"\u2581t{i}": i for i in range(4, names)},
             **{c: names + i for i, c in enumerate(codes)}, "<mask>": names + len(codes)}
    tokenizer = NllbTokenizer(vocab=vocab, merges=[], src_lang=NLLB_SRC_LANG, tgt_lang=NLLB_TGT_LANG)
    if len(tokenizer) != size.vocab - NLLB_PADDING_ROWS:
        raise RuntimeError(f"the NLLB tokenizer has {len(tokenizer)} ids, expected {size.vocab - NLLB_PADDING_ROWS}")
    config = M2M100Config(
        vocab_size=size.vocab, d_model=size.d_model, encoder_layers=size.layers, decoder_layers=size.layers,
        encoder_attention_heads=size.heads, decoder_attention_heads=size.heads, encoder_ffn_dim=size.ffn,
        decoder_ffn_dim=size.ffn, activation_function="relu", scale_embedding=True, tie_word_embeddings=True,
        max_position_embeddings=size.max_positions, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2, forced_eos_token_id=None, dropout=0.0, init_std=size.init_std)
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(decoder_start_token_id=2, pad_token_id=1, bos_token_id=0,
                                               eos_token_id=2, forced_eos_token_id=None, max_length=200,
                                               num_beams=1)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


MARIAN = Family("marian", BASE, TINY, "MarianMTModel", None, 0, 2, None, None, 32, 32, 64)
NLLB = Family("nllb", NLLB_600M, NLLB_TINY, "M2M100ForConditionalGeneration", 1, 2, 4, NLLB_SRC_LANG, NLLB_TGT_LANG,
              16, 8, 32)
FAMILIES = {"marian": (MARIAN, build_hf_model), "nllb": (NLLB, build_nllb_model)}


def make_sentences(n: int, family: Family, size: Size, seed: int = 0,
                   lengths: tuple[int, int] = (10, 40)) -> list[list[int]]:
    """n random sources: 10..40 ids of ordinary tokens (no eos, unk, pad or language code), then eos; NLLB's
    start with the source language's code."""
    import random

    rng = random.Random(seed)
    if family.src_lang is None:
        first, end, prefix = family.first_id, family.pad_id(size), []
    else:
        codes = nllb_codes()
        first, end = family.first_id, family.first_code(size)
        prefix = [end + codes.index(family.src_lang)]
    return [prefix + [rng.randrange(first, end) for _ in range(rng.randint(*lengths))] + [family.eos]
            for _ in range(n)]


def target_prefix(family: Family, size: Size) -> list[int]:
    """The ids forced after the decoder start: NLLB's target language code, none for Marian."""
    return [] if family.tgt_lang is None else [family.first_code(size) + nllb_codes().index(family.tgt_lang)]


def run_cmd(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({' '.join(map(str, cmd))}):\n{(proc.stderr or proc.stdout)[-3000:]}")


def twostep_cli(*args) -> list[str]:
    return [sys.executable, "-m", "twostep.cli", *map(str, args)]


def prepare(work: Path, family: Family, size: Size, engines: list[str], optimum_python: str | None,
            log) -> tuple[dict, dict]:
    """Build (or reuse) every engine's model files under work; returns (paths, errors by engine)."""
    paths = {"hf": work / "hf", "ckpt": work / "twostep-ckpt", "twostep-fp32": work / "twostep-fp32",
             "twostep-int8": work / "twostep-int8", "ct2-fp32": work / "ct2-fp32", "ct2-int8": work / "ct2-int8",
             "optimum": work / "optimum-onnx"}
    errors: dict[str, str] = {}
    if not (paths["hf"] / "model.safetensors").is_file():
        log(f"building the random {size.name} {family.name} model in {paths['hf']}")
        FAMILIES[family.name][1](paths["hf"], size)

    if any(e.startswith("twostep") for e in engines):
        try:
            if not (paths["ckpt"] / "model.safetensors").is_file():
                log("twostep import")
                run_cmd(twostep_cli("import", paths["hf"], "--out", paths["ckpt"], "--force"), "twostep import")
            for dtype in ("fp32", "int8"):
                art = paths[f"twostep-{dtype}"]
                if f"twostep-{dtype}" in engines and not (art / "manifest.json").is_file():
                    log(f"twostep export --dtype {dtype}")
                    run_cmd(twostep_cli("export", paths["ckpt"], "--out", art, "--dtype", dtype, "--force"),
                            f"twostep export --dtype {dtype}")
        except RuntimeError as exc:
            for e in engines:
                if e.startswith("twostep") and not (paths[e] / "manifest.json").is_file():
                    errors[e] = str(exc)

    for dtype, quantization in (("fp32", None), ("int8", "int8")):
        key = f"ct2-{dtype}"
        if key not in engines or (paths[key] / "model.bin").is_file():
            continue
        try:
            from ctranslate2.converters import TransformersConverter
        except ImportError as exc:
            errors[key] = f"ctranslate2 is not installed ({exc}); pip install -e '.[bench]'"
            continue
        log(f"ct2-transformers-converter --quantization {quantization or 'float32'}")
        try:
            TransformersConverter(str(paths["hf"])).convert(str(paths[key]), quantization=quantization, force=True)
        except Exception as exc:  # the converter's own refusal, reported in the table instead of ending the run
            errors[key] = f"CTranslate2's converter failed: {type(exc).__name__}: {exc}"

    if "optimum" in engines:
        if optimum_python is None:
            errors["optimum"] = ("optimum.onnxruntime is not importable here and there is no --optimum-python "
                                 f"(default {DEFAULT_OPTIMUM_PYTHON}): see this module's docstring")
        elif not (paths["optimum"] / "encoder_model.onnx").is_file():
            log(f"Optimum export ({optimum_python})")
            try:
                run_cmd([optimum_python, "-m", "benchmarks.marian", "--optimum-export", str(paths["hf"]),
                         str(paths["optimum"])], "Optimum's export")
            except (RuntimeError, OSError) as exc:
                errors["optimum"] = str(exc)
    return paths, errors


def optimum_export(hf_dir: str, out_dir: str) -> None:
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    tmp = Path(out_dir + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    ORTModelForSeq2SeqLM.from_pretrained(hf_dir, export=True).save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)


def find_optimum_python(given: str | None) -> str | None:
    if given:
        return given
    import importlib.util

    try:
        if importlib.util.find_spec("optimum.onnxruntime") is not None:
            return sys.executable
    except ModuleNotFoundError:
        pass
    return str(DEFAULT_OPTIMUM_PYTHON) if DEFAULT_OPTIMUM_PYTHON.is_file() else None


# ---------------------------------------------------------------------------------------------- the engines
# Each returns decode(batch of source id lists, beam) -> the best hypothesis' token ids per sentence, and the
# versions of what it runs on. They run inside a worker process (worker_main).


def versions(*packages: str) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for p in packages:
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            pass
    return out


def twostep_engine(spec: dict):
    from twostep.runtime.decoding import DecodeOptions
    from twostep.runtime.translator import open_translator

    n = spec["new_tokens"] + len(spec["prefix"])  # the forced code counts against the limit, as transformers counts it
    translator, backend = open_translator(Path(spec["path"]), batch_size=spec["max_batch"],
                                          options=DecodeOptions(beam_size=spec["max_beam"], max_new_tokens=n,
                                                                suppress_eos=True),
                                          threads=spec["threads"])
    options = {b: DecodeOptions(beam_size=b, max_new_tokens=n, suppress_eos=True) for b in (1, spec["max_beam"])}

    def decode(batch, beam):
        return translator.translate_ids(batch, options[beam], tgt_lang=spec["tgt_lang"])

    info = versions("onnxruntime", "numpy")
    info["backend"] = f"{backend.name}, decoder {getattr(backend, 'decoder', '?')}"
    return decode, info


def ct2_engine(spec: dict):
    import ctranslate2

    from benchmarks.ct2_convert import _load_vocab

    n = spec["new_tokens"]
    translator = ctranslate2.Translator(spec["path"], device="cpu", compute_type="default", inter_threads=1,
                                        intra_threads=spec["threads"])
    names = _load_vocab(spec["path"], "source")
    ids = {t: i for i, t in enumerate(_load_vocab(spec["path"], "target"))}

    prefix = [names[i] for i in spec["prefix"]]  # counted in the decoding length, returned in the hypotheses
    length = n + len(prefix)

    def decode(batch, beam):
        results = translator.translate_batch([[names[i] for i in s] for s in batch], beam_size=beam,
                                             max_input_length=0, max_decoding_length=length,
                                             min_decoding_length=length, length_penalty=1.0,
                                             target_prefix=[prefix] * len(batch) if prefix else None)
        return [[ids[t] for t in r.hypotheses[0][len(prefix):]] for r in results]

    info = versions("ctranslate2")
    info["compute_type"] = translator.compute_type
    return decode, info


def hf_generate(model, spec: dict):
    """decode() over transformers' generate (eager transformers or Optimum's ORTModelForSeq2SeqLM)."""
    import torch

    pad, prefix = spec["pad"], spec["prefix"]
    n = spec["new_tokens"] + len(prefix)
    forced = {"forced_bos_token_id": prefix[0]} if prefix else {}

    def decode(batch, beam):
        width = max(len(s) for s in batch)
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in batch])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in batch])
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, num_beams=beam, do_sample=False,
                                 max_new_tokens=n, min_new_tokens=n, bad_words_ids=[[pad]], length_penalty=1.0,
                                 num_return_sequences=1, **forced)
        return [row[1 + len(prefix):].tolist() for row in out]  # without the decoder start and the forced code

    return decode


def optimum_engine(spec: dict):
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    torch.set_num_threads(spec["threads"])  # generate's logits processing and beam bookkeeping run in torch
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = spec["threads"], 1
    model = ORTModelForSeq2SeqLM.from_pretrained(spec["path"], session_options=options,
                                                 provider="CPUExecutionProvider")
    info = versions("optimum", "optimum-onnx", "onnxruntime", "transformers", "torch")
    info["decoder"] = "merged" if model.decoder.is_merged else "decoder + decoder_with_past"
    return hf_generate(model, spec), info


def transformers_engine(spec: dict):
    import torch
    import transformers

    torch.set_num_threads(spec["threads"])
    model = getattr(transformers, spec["hf_class"]).from_pretrained(spec["path"]).eval()
    return hf_generate(model, spec), versions("transformers", "torch")


FACTORIES = {"twostep": twostep_engine, "ct2": ct2_engine, "optimum": optimum_engine,
             "transformers": transformers_engine}


def worker_main(spec: dict) -> int:
    """Serve one engine over stdin/stdout, one JSON line each way: {"batches": [...], "beam": k} -> seconds and
    tokens. Whatever the libraries print goes to stderr, not into the protocol."""
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
        tokens = []
        t0 = time.perf_counter()
        for batch in msg["batches"]:
            tokens += decode(batch, msg["beam"])
        seconds = time.perf_counter() - t0
        proto.write(json.dumps({"seconds": seconds, "tokens": tokens}) + "\n")
        proto.flush()
    return 0


class Worker:
    """One engine in its own process (its own interpreter for Optimum), loaded once: `python -m module --worker
    SPEC`, that module's worker_main serving it (benchmarks/argos.py's workers are this module's too)."""

    def __init__(self, name: str, python: str, spec: dict, log_path: Path, module: str = "benchmarks.marian"):
        self.name = name
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.log = open(log_path, "w")  # closed in close()
        try:
            self.proc = subprocess.Popen([python, "-m", module, "--worker", json.dumps(spec)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                         env=env, cwd=REPO)
        except OSError:
            self.log.close()
            raise
        self.log_path = log_path
        try:
            ready = self._read()
        except BaseException:
            self.close()
            raise
        self.load_s, self.info = ready["load_s"], ready["info"]

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            tail = self.log_path.read_text()[-3000:]
            raise RuntimeError(f"the {self.name} worker ended (exit code {self.proc.returncode}):\n{tail}")
        return json.loads(line)

    def call(self, message: dict) -> dict:
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def run(self, batches: list[list[list[int]]], beam: int) -> tuple[float, list[list[int]]]:
        reply = self.call({"batches": batches, "beam": beam})
        return reply["seconds"], reply["tokens"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# ---------------------------------------------------------------------------------------------- measuring


def batches_of(sentences: list[list[int]], size: int) -> list[list[list[int]]]:
    return [sentences[i : i + size] for i in range(0, len(sentences), size)]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def load_average() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def speedup_rows(rows: dict, workloads: list[Workload]) -> list[dict]:
    out = []
    for fast, other, target in TARGETS:
        for w in workloads:
            a, b = rows.get((fast, w.name)), rows.get((other, w.name))
            if a is None or b is None:
                continue
            ratio = b["median_s"] / a["median_s"]
            out.append({"twostep": fast, "other": other, "workload": w.name, "speedup": ratio, "target": target,
                        "met": ratio >= target})
    return out


def identical(a: list[list[int]], b: list[list[int]]) -> int:
    return sum(x == y for x, y in zip(a, b))


def report(meta: dict, rows: dict, engines: list[str], workloads: list[Workload], errors: dict,
           speedups: list[dict]) -> str:
    lines = [f"CPU: {meta['cpu']}; {meta['threads']} threads per engine; {meta['new_tokens']} new tokens per "
             f"sentence; medians of {meta['iters']} interleaved runs after {meta['warmup']} warm-up; {meta['date']}; "
             f"load average before/after {meta['load_average']['before']}/{meta['load_average']['after']}",
             "", "| workload | engine | median s | tokens/s | min-max s | tokens = eager fp32 | load s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for w in workloads:
        for e in engines:
            r = rows.get((e, w.name))
            if r is None:
                continue
            same = f"{r['same_as_eager']}/{r['sentences']}" if r.get("same_as_eager") is not None else "-"
            lines.append(f"| {w.name} | {LABELS[e]} | {r['median_s']:.2f} | {r['tokens_per_s']:,.0f} | "
                         f"{min(r['seconds']):.2f}-{max(r['seconds']):.2f} | {same} | {r['load_s']:.1f} |")
    for e, why in errors.items():
        lines.append(f"| all | {LABELS[e]} | not run: {why.splitlines()[0][:200]} | | | | |")
    if speedups:
        lines += ["", "| speedup (other's time / twostep's) | workload | measured | target | met |",
                  "|---|---|---:|---:|---|"]
        for s in speedups:
            lines.append(f"| {LABELS[s['twostep']]} vs {LABELS[s['other']]} | {s['workload']} | "
                         f"{s['speedup']:.2f}x | {s['target']:.1f}x | {'yes' if s['met'] else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=sorted(FAMILIES), default="marian",
                   help="marian: OPUS-MT's size; nllb: NLLB-200-distilled-600M's (see above)")
    p.add_argument("--work", type=Path, help="model files are built here once and reused (default: a temp dir)")
    p.add_argument("--tiny", action="store_true", help="a tiny model (d 32, 2+2 layers), 2 sentences, "
                   "1 iteration, 8 new tokens: the smoke test's")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}, "
                   "transformers (eager, as a timed engine too)")
    p.add_argument("--sentences", type=int, help="sentences of the batched workloads (default 64)")
    p.add_argument("--sentences-b1", type=int, help="sentences of the batch-1 workload (default 16)")
    p.add_argument("--batch", type=int, help="the greedy batch workload's (default: marian 32, nllb 16)")
    p.add_argument("--beam-batch", type=int, help="the beam workload's batch (default: marian 32, nllb 8)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--workloads", default="greedy-b1,greedy,beam",
                   help="of greedy-b1, greedy (batch --batch), beam (batch --beam-batch)")
    p.add_argument("--new-tokens", type=int)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int)
    p.add_argument("--pause", type=float, default=0.2,
                   help="seconds between two engines' runs (OpenMP pools spin a while after a run)")
    p.add_argument("--optimum-python", help="interpreter with optimum-onnx for the Optimum engine")
    p.add_argument("--prepare-only", action="store_true",
                   help="build and convert the models and compute the reference tokens into --work, then stop")
    p.add_argument("--json", type=Path, help="write the numbers and tokens' agreement here")
    p.add_argument("--markdown", type=Path, help="write the tables here")
    # internal
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--optimum-export", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(json.loads(args.worker))
    if args.optimum_export:
        optimum_export(*args.optimum_export)
        return 0

    family = FAMILIES[args.family][0]
    size = family.tiny if args.tiny else family.base
    batch, beam_batch = args.batch or family.batch, args.beam_batch or family.beam_batch
    n32 = args.sentences or (2 if args.tiny else 64)
    n1 = min(args.sentences_b1 or (2 if args.tiny else 16), n32)
    new_tokens = args.new_tokens or (8 if args.tiny else family.new_tokens)
    iters = args.iters or (1 if args.tiny else 3)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(engines) - set(ENGINES) - {"transformers"}
    if unknown:
        p.error(f"unknown engines {sorted(unknown)}; choose from {', '.join(ENGINES)}, transformers")
    all_workloads = {"greedy-b1": Workload("greedy batch 1", 1, 1, n1),
                     "greedy": Workload(f"greedy batch {batch}", batch, 1, n32),
                     "beam": Workload(f"beam {args.beam} batch {beam_batch}", beam_batch, args.beam, n32)}
    aliases = {"greedy-b32": "greedy", "beam-b32": "beam"}  # the names before --family
    keys = [aliases.get(k.strip(), k.strip()) for k in args.workloads.split(",") if k.strip()]
    if set(keys) - set(all_workloads):
        p.error(f"unknown workloads {sorted(set(keys) - set(all_workloads))}; choose from greedy-b1, greedy, beam")
    workloads = [all_workloads[k] for k in keys]

    def log(msg: str) -> None:
        print(f"[{family.name} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    work = args.work or Path(tempfile.mkdtemp(prefix=f"twostep-{family.name}-"))
    work = work / (size.name if family is MARIAN else f"{family.name}-{size.name}")
    work.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    optimum_python = find_optimum_python(args.optimum_python) if "optimum" in engines else None
    paths, errors = prepare(work, family, size, engines, optimum_python, log)
    sentences = make_sentences(n32, family, size)
    pad = family.pad_id(size)
    max_beam = max(w.beam for w in workloads)
    common = {"threads": args.threads, "new_tokens": new_tokens, "pad": pad, "max_batch": max(batch, beam_batch),
              "max_beam": max_beam, "prefix": target_prefix(family, size), "tgt_lang": family.tgt_lang,
              "hf_class": family.hf_class}

    def spec(engine: str) -> dict:
        kind = engine.split("-")[0]
        path = paths["hf"] if engine == "transformers" else paths[engine]
        return {**common, "kind": kind, "path": str(path)}

    # The reference: eager transformers, once, on the batch workloads' batches (batch 1 reads its prefix).
    ref_batch = {max_beam: beam_batch, 1: batch}
    ref_file = work / f"reference-{n32}x{new_tokens}-b{batch}-beam{max_beam}-b{beam_batch}.json"
    if ref_file.is_file():
        reference = {int(k): v for k, v in json.loads(ref_file.read_text()).items()}
    else:
        log("eager transformers reference (greedy and beam)")
        ref_worker = Worker("transformers", sys.executable, spec("transformers"), work / "logs" / "reference.log")
        try:
            reference = {beam: ref_worker.run(batches_of(sentences, ref_batch[beam]), beam)[1]
                         for beam in sorted({1, max_beam})}
        finally:
            ref_worker.close()
        ref_file.write_text(json.dumps(reference))
    if args.prepare_only:
        for e, why in errors.items():
            log(f"{e} cannot run: {why}")
        log(f"prepared {work}")
        return 1 if errors else 0

    load_before = load_average()
    if load_before is not None and load_before > 0.5:
        log(f"warning: load average {load_before:.2f} before timing: something else is running. Engines with 2 threads "
            "on 2 busy cores slow down by far more than their share (CTranslate2 fp32's barriers by 5-10x)")
    workers: dict[str, Worker] = {}
    try:
        for e in engines:
            if e in errors:
                continue
            python = optimum_python if e == "optimum" else sys.executable
            log(f"loading {e}")
            try:
                workers[e] = Worker(e, python, spec(e), work / "logs" / f"{e}.log")
            except (RuntimeError, OSError) as exc:
                errors[e] = str(exc)
        rows: dict[tuple[str, str], dict] = {}
        for w in workloads:
            batches = batches_of(sentences[: w.n_sentences], w.batch)
            times: dict[str, list[float]] = {e: [] for e in workers}
            tokens: dict[str, list[list[int]]] = {}
            for i in range(args.warmup + iters):
                log(f"{w.name}: {'warm-up' if i < args.warmup else f'run {i - args.warmup + 1}/{iters}'}")
                for e, worker in workers.items():
                    seconds, out = worker.run(batches, w.beam)
                    if i >= args.warmup:
                        times[e].append(seconds)
                    tokens[e] = out
                    time.sleep(args.pause)
            ref = reference[w.beam][: w.n_sentences]
            for e in workers:
                lengths = [len(t) for t in tokens[e]]
                med = statistics.median(times[e])
                rows[e, w.name] = {
                    "engine": e, "workload": w.name, "batch": w.batch, "beam": w.beam, "sentences": w.n_sentences,
                    "seconds": times[e], "median_s": med, "tokens": sum(lengths), "tokens_per_s": sum(lengths) / med,
                    "all_lengths_equal_new_tokens": all(n == new_tokens for n in lengths),
                    "pad_generated": sum(t.count(pad) for t in tokens[e]),
                    "same_as_eager": identical(tokens[e], ref), "load_s": workers[e].load_s,
                    "same_as": {o: identical(tokens[e], tokens[o]) for o in workers if o != e},
                }
                if not rows[e, w.name]["all_lengths_equal_new_tokens"]:
                    log(f"warning: {e} did not give {new_tokens} tokens for every sentence ({min(lengths)}.."
                        f"{max(lengths)}); tokens/s counts what it gave")
    finally:
        for worker in workers.values():
            worker.close()

    speedups = speedup_rows(rows, workloads)
    meta = {"cpu": cpu_model(), "threads": args.threads, "new_tokens": new_tokens, "iters": iters,
            "warmup": args.warmup, "date": time.strftime("%Y-%m-%d %H:%M"), "family": family.name,
            "size": size.__dict__,
            "python": sys.version.split()[0], "engines": {e: w.info for e, w in workers.items()},
            "command": " ".join(["python -m benchmarks.marian", *(argv if argv is not None else sys.argv[1:])]),
            "work": str(work), "load_average": {"before": load_before, "after": load_average()}}
    table = report(meta, rows, engines, workloads, errors, speedups)
    print(table)
    print("\nengine versions: " + "; ".join(f"{LABELS[e]}: {', '.join(f'{k} {v}' for k, v in info.items())}"
                                            for e, info in meta["engines"].items()))
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": list(rows.values()), "speedups": speedups,
                                         "errors": errors}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
