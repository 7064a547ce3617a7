"""twostep serve side by side with LibreTranslate itself, on the same Argos packages, in one run on one machine.

    python -m benchmarks.libretranslate [--clients 1,8,32] [--requests N] [--seconds S] [--rounds 3] [--threads 2]
                                        [--lt-venv DIR] [--no-install] [--engines libretranslate,twostep]
                                        [--dtype fp32|int8] [--mastodon-source explicit|auto] [--tiny]
                                        [--work DIR] [--json OUT] [--markdown OUT]

LibreTranslate (libretranslate==1.9.6 from PyPI) lives in its own venv, `--lt-venv` (default
~/.cache/twostep-bench/libretranslate-1.9.6), made with `python3 -m venv` and pip install when absent (unless
`--no-install`: then its side is skipped, with the reason in the JSON); it pulls no torch. It starts offline:
ARGOS_PACKAGES_DIR is a folder holding the packages as argostranslate installs them (each .argosmodel's one
folder, metadata.json in it: argostranslate/package.py get_installed_packages), `--load-only` their languages
(with two packages installed or more, LibreTranslate's boot fetches no index), `--disable-web-ui
--disable-files-translation`, waitress' default 4 threads, and CTranslate2 on `--threads` intra-op threads
(ARGOS_INTRA_THREADS; compute_type "auto", int8 here). Its sentence splitter, MiniSBD, would download a model at
the first translation: this module's `--launch-libretranslate` starts LibreTranslate's main() under its venv's
interpreter with argostranslate.translate.MiniSBDSentencizer replaced by `split_sentences` below (a sentence
ends after . ! or ? before whitespace). The benchmark checks that this gives, on every text it sends, the
sentences twostep's own splitter (sentencex) gives, so both engines translate the same sentences.

The packages, built here (nothing downloaded), each also `twostep import`ed and `twostep export`ed (`--dtype`,
default fp32, as a plain export; int8 is ONNX Runtime's dynamic int8):
- en->fr and fr->en: tests/ct2_models.py's tiny trained OpenNMT-py model (seeds 1 and 2), CTranslate2 int8,
  as an .argosmodel (its builders, run in a child with tests/ on PYTHONPATH);
- en->es at an Argos model's real size: OpenNMT-py's Transformer base (d_model 512, 6+6 layers, 8 heads, d_ff
  2048), random weights (xavier, seed 0), a shared SentencePiece vocabulary of 32,000 pieces trained on random
  syllables and the benchmark's sentences, CTranslate2 int8 as argos-train converts. Its </s> row is fitted
  (benchmarks/argos.py's fit_eos) so that greedy decoding ends each benchmark sentence at about 1.1 x its
  source length. `--tiny` leaves it out (the test's seconds-long run).

twostep serves the artifacts with one `twostep serve ART1 ART2 ...` on `--threads`, as LibreTranslate serves its
packages from one process (`SERVE_MANY = False`: one server a pair, each request sent to its pair's server).

1. Same requests, same text: each input (sentences and paragraphs of 2-3 sentences, per pair) sent to both
   servers (POST /translate, JSON, explicit source and target, format text), one at a time; the share whose
   translatedText is identical (both apply LibreTranslate's formatting to text: twostep.serving.api.libretranslate
   `formatted`). LibreTranslate computes in int8,
   twostep in `--dtype` from the int8 weights dequantized: some differences are expected. The Mastodon-shaped
   requests of the load are compared too (html). --json lists differing examples.
2. Load: `--clients` closed-loop clients (aiohttp) per engine, each sending the next request of a fixed mix
   until `--requests` were sent or `--seconds` passed (the requests in flight then are awaited and counted):
   Mastodon-shaped, `{"q": [<html status>, (<spoiler>)], "source": ..., "target": ..., "format": "html"}` as
   Mastodon's LibreTranslate service sends (source "auto", its default; `--mastodon-source explicit`: the real
   source), and libretranslatepy-shaped, form-encoded
   `q, source, target` as `LibreTranslateAPI(url).translate` sends them. Neither sends an API key (Mastodon's
   api_key is null, libretranslatepy leaves the field out): LibreTranslate 1.9.6 caches the answers of requests
   whose api_key is "" (its --translation-cache default "" is split into [""], the list of keys to cache for),
   and a cached answer takes it no time. The comparison above warms both engines up. The load runs for each
   model size apart (small: the tiny pairs' requests; Argos-sized: en-es's), each level in `--rounds` rounds of
   requests/rounds and seconds/rounds, the engines alternating, pooled. Reported, per size: requests/s,
   sentences/s, p50/p99 latency (and p50 per pair), errors, and twostep / LibreTranslate ratios against the
   issue's targets, for each size (>= 3x throughput at 32 clients; lower p50 at 1). The machine is shared with
   whatever else runs on it: the load average is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

# Only the standard library at module level (benchmarks.marian's too): --launch-libretranslate runs this file under
# LibreTranslate's venv.
from benchmarks.marian import run_cmd, twostep_cli

LT_VERSION = "1.9.6"
DEFAULT_VENV = Path.home() / ".cache" / "twostep-bench" / f"libretranslate-{LT_VERSION}"
REPO = Path(__file__).resolve().parents[1]
SERVE_MANY = True  # one `twostep serve ART1 ART2 ...` for every pair (False: a server a pair, the client routing)
ENGINES = ("libretranslate", "twostep")
LABELS = {"libretranslate": f"LibreTranslate {LT_VERSION}", "twostep": "twostep serve"}
TARGETS = {"throughput": (32, 3.0), "p50": (1, 1.0)}  # the issue's: >= 3x requests/s at 32 clients, lower p50 at 1
SIZES = ("small", "Argos-sized")  # the tiny trained pairs, the Transformer base pair: each size's load is its own
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_sentences(text: str) -> list[str]:
    """LibreTranslate's splitter in this benchmark (in place of MiniSBD, which downloads its model)."""
    return [s for s in SENTENCE_END.split(text.strip()) if s]


# ---------------------------------------------------------------------------------------------- the texts

EN = ["The weather in the mountains changed quickly this afternoon.",
      "We are looking for volunteers to help translate the documentation.",
      "Did anyone else notice that the train was twenty minutes late again?",
      "My grandmother grows tomatoes, peppers and beans in her small garden.",
      "The new release fixes several bugs and makes the server start faster.",
      "I finally finished reading the novel that my friend recommended last year.",
      "Please remember to bring your own cup to the meeting tomorrow morning.",
      "The museum is free on the first Sunday of every month.",
      "Our cat refuses to eat anything except the most expensive fish.",
      "This is the best coffee I have had in a long time!",
      "The city council will vote on the new bicycle lanes next week.",
      "Could you explain how the translation service handles very long paragraphs?",
      "After the storm, the whole neighbourhood came out to clear the streets.",
      "Learning a new language takes patience, practice and a good sense of humour.",
      "The library opens at nine and closes at six on weekdays.",
      "Thank you all for the kind messages on my birthday!"]
EN_SMALL = ["The cat sat in the park.", "Hello dog.", "A quick fox jumps over the lazy dog.",
            "We ran all day over the mat.", "Good world today.", "Three brown cats sat on the mat.",
            "The dog ran in the garden.", "Good morning world!"]
FR = ["Le chat est sur le tapis.", "Un chien court dans le parc.", "Bonjour le monde.",
      "Nous sommes dans le jardin toute la journée.", "Le renard brun saute par dessus le chien.",
      "Il fait beau aujourd'hui.", "Merci pour votre message!", "Où est la gare?"]


@dataclass(frozen=True)
class Pair:
    source: str
    target: str
    sentences: tuple[str, ...]
    base: bool  # the Argos-sized model (else a tiny one)

    @property
    def name(self) -> str:
        return f"{self.source}-{self.target}"

    @property
    def size(self) -> str:  # the load is run, and reported, for each size apart
        return SIZES[1] if self.base else SIZES[0]


PAIRS = (Pair("en", "es", tuple(EN), True), Pair("en", "fr", tuple(EN_SMALL), False),
         Pair("fr", "en", tuple(FR), False))


def paragraphs(sentences: tuple[str, ...]) -> list[list[str]]:
    """Consecutive sentences in groups of 2 and 3, in turn."""
    out, at, size = [], 0, 2
    while at + size <= len(sentences):
        out.append(list(sentences[at : at + size]))
        at, size = at + size, 5 - size
    return out


@dataclass
class Request:
    pair: Pair
    kind: str  # "text" (the comparison's), "mastodon" or "libretranslatepy"
    body: dict
    form: bool  # form-encoded (else JSON)
    sentences: int

    def describe(self) -> dict:
        return {"pair": self.pair.name, "kind": self.kind, "body": self.body}


def text_requests(pairs: list[Pair]) -> list[Request]:
    """The comparison's inputs: every sentence and paragraph of each pair, JSON, format text."""
    out = []
    for pair in pairs:
        for group in [[s] for s in pair.sentences] + paragraphs(pair.sentences):
            body = {"q": " ".join(group), "source": pair.source, "target": pair.target, "format": "text"}
            out.append(Request(pair, "text", body, False, len(group)))
    return out


def mastodon_request(pair: Pair, groups: list[list[str]], spoiler: str | None, source: str) -> Request:
    """As Mastodon's TranslationService::LibreTranslate sends a status: its HTML (and its content warning) in q."""
    html = "".join(f"<p>{' '.join(g)}</p>" for g in groups)
    q = [html] + ([spoiler] if spoiler else [])
    body = {"q": q, "source": pair.source if source == "explicit" else "auto", "target": pair.target,
            "format": "html", "api_key": None}  # Mastodon's @api_key, nil without one
    return Request(pair, "mastodon", body, False, sum(map(len, groups)) + bool(spoiler))


def load_requests(pairs: list[Pair], mastodon_source: str) -> list[Request]:
    """The load's mix, in the order clients take it (cycled): a Mastodon status and a libretranslatepy call of each
    pair in turn, so that the requests one engine answers in its time hold the same mix as another's."""
    mastodon: dict[str, list[Request]] = {}
    plain: dict[str, list[Request]] = {}
    for pair in pairs:
        groups = paragraphs(pair.sentences)
        mastodon[pair.name] = [
            mastodon_request(pair, [group] if i % 2 else [group[:1], group[1:]],
                             pair.sentences[i] if i % 3 == 2 else None, mastodon_source)
            for i, group in enumerate(groups)]
        plain[pair.name] = [
            Request(pair, "libretranslatepy", {"q": text, "source": pair.source, "target": pair.target}, True,
                    len(split_sentences(text)))  # no key: no api_key field
            for text in [*pair.sentences, *(" ".join(g) for g in groups)]]
    rounds = max(len(x) for x in [*mastodon.values(), *plain.values()])
    return [kind[pair.name][i % len(kind[pair.name])] for i in range(rounds) for pair in pairs
            for kind in (mastodon, plain)]


def check_splitting(pairs: list[Pair]) -> None:
    """Every text the benchmark sends splits into the same sentences by LibreTranslate's splitter here and by
    twostep's (twostep.runtime.documents): else the engines would translate different sentences."""
    from twostep.runtime.documents import sentence_spans

    for pair in pairs:
        for group in [[s] for s in pair.sentences] + paragraphs(pair.sentences):
            text = " ".join(group)
            ours = [text[a:b] for a, b in sentence_spans(text, pair.source)]
            if ours != group or split_sentences(text) != group:
                raise RuntimeError(f"{text!r}: twostep splits it into {ours}, this benchmark's LibreTranslate "
                                   f"splitter into {split_sentences(text)}; each should give {group}")


# ---------------------------------------------------------------------------------------------- the packages


def build_packages(out: Path, tiny: bool) -> None:
    """The .argosmodel packages into `out` (run in a child with tests/ on PYTHONPATH, for tests/ct2_models.py)."""
    import ct2_models

    for seed, pair in ((1, PAIRS[1]), (2, PAIRS[2])):
        work = out / f"build-{pair.name}"
        ckpt = ct2_models.opennmt_py_checkpoint(work / "opennmt_py", seed=seed)
        ct2 = ct2_models.convert_opennmt_py(ckpt, work / "ct2-int8", quantization="int8")
        ct2_models.argos_package(ct2, ckpt.parent / "sentencepiece.model", out, pair.source, pair.target)
    if not tiny:
        work = out / "build-en-es"
        ct2 = base_model(work, PAIRS[0])
        ct2_models.argos_package(ct2, work / "sentencepiece.model", out, "en", "es")


def base_model(work: Path, pair: Pair, vocab_size: int = 32000, seed: int = 0) -> Path:
    """The Argos-sized model: a SentencePiece model of `vocab_size` pieces, OpenNMT-py's Transformer base with random
    weights and a fitted </s>, converted to CTranslate2 int8. Returns the CTranslate2 directory."""
    import io
    import random

    import sentencepiece as spm
    import torch

    from benchmarks.argos import fit_eos
    from benchmarks.opennmt_py import (
        ARGOS,
        SPECIALS,
        UNK,
        build_model,
        convert_opennmt_py,
        init_glorot,
        save_checkpoint,
    )

    def log(msg: str) -> None:
        print(f"[libretranslate {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["th", "er", "an", "qu", "ch"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(200_000)]
    lines = [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)] + list(pair.sentences) * 50
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
                                   hard_vocab_limit=False, character_coverage=1.0, minloglevel=2, num_threads=2)
    (work / "sentencepiece.model").write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_file=str(work / "sentencepiece.model"))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    vocab = SPECIALS + [p for p in pieces if p not in SPECIALS]
    index = {p: i for i, p in enumerate(vocab)}
    sentences = [[index.get(p, UNK) for p in sp.encode(s, out_type=str)] for s in pair.sentences]
    log(f"SentencePiece: {len(pieces)} pieces; the sentences are {min(map(len, sentences))}-"
        f"{max(map(len, sentences))} pieces")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(seed)
        net = build_model(len(vocab), ARGOS, add_qkvbias=False).eval()
        init_glorot(net)
        fitted = fit_eos(net, sentences, log)
    finally:
        torch.set_num_threads(threads)
    (work / "eos_fit.json").write_text(json.dumps(fitted))
    ckpt = save_checkpoint(net, vocab, ARGOS, False, work / "opennmt_py" / "model.pt")
    return convert_opennmt_py(ckpt, work / "ct2-int8", "int8")


def prepare(work: Path, pairs: list[Pair], dtype: str, log) -> dict[str, Path]:
    """Build (or reuse) the packages, install them for argostranslate and import and export them for twostep:
    {"packages": the ARGOS_PACKAGES_DIR, pair name: its artifact}."""
    packages, installed = work / "packages", work / "argos-packages"
    missing = [p for p in pairs if not (packages / f"translate-{p.source}_{p.target}-1_0.argosmodel").is_file()]
    if missing:
        log(f"building the packages ({', '.join(p.name for p in missing)})")
        shutil.rmtree(packages, ignore_errors=True)
        packages.mkdir(parents=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)])}
        cmd = [sys.executable, "-m", "benchmarks.libretranslate", "--build-packages", str(packages)]
        proc = subprocess.run(cmd + (["--tiny"] if not any(p.base for p in pairs) else []), cwd=REPO, env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building the packages failed:\n{proc.stderr[-3000:]}")
    paths = {"packages": installed}
    for pair in pairs:
        package = packages / f"translate-{pair.source}_{pair.target}-1_0.argosmodel"
        if not (installed / package.stem / "metadata.json").is_file():
            with zipfile.ZipFile(package) as archive:  # argostranslate.package.install_from_path
                archive.extractall(installed)
        art, ckpt = work / f"twostep-{pair.name}-{dtype}", work / f"twostep-{pair.name}-ckpt"
        if not (art / "manifest.json").is_file():
            log(f"twostep import {package.name}; export --dtype {dtype}")
            run_cmd(twostep_cli("import", package, "--out", ckpt, "--force"), "twostep import")
            run_cmd(twostep_cli("export", ckpt, "--out", art, "--dtype", dtype, "--force"), "twostep export")
        paths[pair.name] = art
    return paths


# ---------------------------------------------------------------------------------------------- LibreTranslate


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def lt_installed(venv: Path) -> bool:
    python = venv_python(venv)
    return python.is_file() and subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; assert m.version('libretranslate') == '{LT_VERSION}'"],
        capture_output=True).returncode == 0


def install_libretranslate(venv: Path, log) -> None:
    """`python3 -m venv` and pip install libretranslate==LT_VERSION; refuses a venv where torch came along."""
    log(f"installing libretranslate=={LT_VERSION} into {venv}")
    run_cmd(["python3", "-m", "venv", str(venv)], "python3 -m venv")
    run_cmd([str(venv_python(venv)), "-m", "pip", "install", "--quiet", f"libretranslate=={LT_VERSION}"],
            "pip install libretranslate")
    if subprocess.run([str(venv_python(venv)), "-c", "import torch"], capture_output=True).returncode == 0:
        raise RuntimeError(f"{venv}: pip installed torch with libretranslate; LibreTranslate {LT_VERSION} needs none")


def launch_libretranslate(argv: list[str]) -> None:
    """LibreTranslate's main(), in its venv, with MiniSBD replaced by split_sentences (no model to download)."""
    import argostranslate.sbd
    import argostranslate.translate

    class Sentencizer(argostranslate.sbd.ISentenceBoundaryDetectionModel):
        def __init__(self, pkg):
            self.pkg = pkg

        def split_sentences(self, text: str) -> list[str]:
            return split_sentences(text)

    argostranslate.translate.MiniSBDSentencizer = Sentencizer  # what PackageTranslation builds by default
    from libretranslate.main import main

    sys.argv = ["libretranslate", *argv]
    main()


def lt_version_info(venv: Path) -> dict:
    code = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
            "('libretranslate', 'argos-translate-lt', 'ctranslate2', 'waitress')}))")
    proc = subprocess.run([str(venv_python(venv)), "-c", code], capture_output=True, text=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else {}


# ---------------------------------------------------------------------------------------------- the servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on 127.0.0.1:`port`, ready once GET `ready_path` answers 200; its output in `log`."""

    def __init__(self, name: str, cmd: list[str], port: int, ready_path: str, log: Path, env: dict | None = None,
                 timeout_s: float = 300):
        import httpx

        self.name, self.url = name, f"http://127.0.0.1:{port}"
        self.log = open(log, "w")  # closed in close()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                self.close()
                raise RuntimeError(f"{name} exited ({self.proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + ready_path, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"{name} not ready after {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def start_libretranslate(venv: Path, packages: Path, pairs: list[Pair], threads: int, logs: Path) -> Server:
    port = free_port()
    languages = sorted({code for p in pairs for code in (p.source, p.target)})
    env = {**os.environ, "ARGOS_PACKAGES_DIR": str(packages), "ARGOS_INTRA_THREADS": str(threads),
           "ARGOS_DEVICE_TYPE": "cpu", "PYTHONPATH": str(REPO)}
    cmd = [str(venv_python(venv)), "-m", "benchmarks.libretranslate", "--launch-libretranslate", "--host",
           "127.0.0.1", "--port", str(port), "--load-only", ",".join(languages), "--disable-web-ui",
           "--disable-files-translation"]
    return Server("libretranslate", cmd, port, "/languages", logs / "libretranslate.log", env)


def start_twostep(arts: dict[str, Path], threads: int, logs: Path) -> dict[str, Server]:
    """{pair name: the server that translates it}: one server for all (SERVE_MANY) or one a pair."""
    def serve(names: list[str]) -> Server:
        port = free_port()
        cmd = twostep_cli("serve", *(arts[n] for n in names), "--port", port, "--threads", threads)
        return Server(f"twostep serve {' '.join(names)}", cmd, port, "/readyz", logs / f"twostep-{'+'.join(names)}.log")

    if SERVE_MANY:
        one = serve(list(arts))
        return dict.fromkeys(arts, one)
    servers: dict[str, Server] = {}
    try:
        for name in arts:
            servers[name] = serve([name])
    except BaseException:
        for server in servers.values():
            server.close()
        raise
    return servers


@dataclass
class Engine:
    name: str
    urls: dict[str, str]  # pair name -> base URL
    servers: list[Server] = field(default_factory=list)

    def close(self) -> None:
        for server in {id(s): s for s in self.servers}.values():
            server.close()


# ---------------------------------------------------------------------------------------------- asking


async def post(session, engine: Engine, request: Request):
    """(status, reply JSON or text)."""
    url = engine.urls[request.pair.name] + "/translate"
    kwargs = {"data": request.body} if request.form else {"json": request.body}
    async with session.post(url, **kwargs) as r:
        text = await r.text()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text


async def compare(engines: dict[str, Engine], requests: list[Request]) -> dict:
    """Each request once to each engine, one at a time: how often translatedText is identical, per kind of
    request, and the differing ones."""
    import aiohttp

    answers: dict[str, list] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for name, engine in engines.items():
            answers[name] = [await post(session, engine, r) for r in requests]
    if len(engines) < 2:
        return {"compared": False, "reason": "only one engine ran", "errors": errors_of(answers)}
    lt, ts = answers["libretranslate"], answers["twostep"]
    out: dict = {"compared": True, "errors": errors_of(answers), "kinds": {}, "differing": []}
    for kind in dict.fromkeys(r.kind for r in requests):
        indices = [i for i, r in enumerate(requests) if r.kind == kind and lt[i][0] == 200 and ts[i][0] == 200]
        same = 0
        for i in indices:
            a, b = lt[i][1]["translatedText"], ts[i][1]["translatedText"]
            same += a == b
            if a != b:
                out["differing"].append({**requests[i].describe(), "libretranslate": a, "twostep": b})
        out["kinds"][kind] = {"requests": len(indices), "identical": same,
                              "identical_rate": same / max(len(indices), 1)}
    return out


def errors_of(answers: dict[str, list]) -> dict[str, list]:
    return {name: [str(reply)[:300] for status, reply in got if status != 200] for name, got in answers.items()}


async def closed_loop(engine: Engine, requests: list[Request], clients: int, max_requests: int, seconds: float,
                      start: int = 0) -> dict:
    """`clients` workers, each sending the next request of the cycled mix (from its `start`-th) and waiting for its
    answer, until `max_requests` were sent or `seconds` passed; the requests in flight then are awaited. Each
    answered request's (pair, seconds)."""
    import aiohttp

    sent = 0
    run: dict = {"latencies": [], "sentences": 0, "errors": []}
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def worker():
            nonlocal sent
            while sent < max_requests and time.monotonic() < deadline:
                request = requests[(start + sent) % len(requests)]
                sent += 1
                t0 = time.perf_counter()
                try:
                    status, reply = await post(session, engine, request)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    status, reply = None, repr(exc)
                if status == 200:
                    run["latencies"].append((request.pair.name, time.perf_counter() - t0))
                    run["sentences"] += request.sentences
                else:
                    run["errors"].append(f"{status}: {str(reply)[:200]}")

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        run["wall_s"] = time.perf_counter() - started
    run["sent"] = sent
    return run


def summary(engine: str, clients: int, runs: list[dict]) -> dict:
    """An engine's rounds at one level, pooled: answers and sentences over the rounds' summed time, percentiles of
    every answer's latency."""
    latencies = [x for run in runs for x in run["latencies"]]
    wall = sum(run["wall_s"] for run in runs)
    ok, sentences = len(latencies), sum(run["sentences"] for run in runs)
    errors = [e for run in runs for e in run["errors"]]
    ms = sorted(1000 * x for _, x in latencies) or [float("nan")]
    by_pair = {name: sorted(1000 * x for n, x in latencies if n == name) for name in dict(latencies)}
    return {"engine": engine, "clients": clients, "rounds": len(runs), "sent": sum(run["sent"] for run in runs),
            "ok": ok, "errors": len(errors), "sentences": sentences, "wall_s": wall, "requests_per_s": ok / wall,
            "sentences_per_s": sentences / wall, "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
            "p50_ms_by_pair": {name: percentile(x, 50) for name, x in by_pair.items()},
            "round_requests_per_s": [len(run["latencies"]) / run["wall_s"] for run in runs],
            "error_examples": errors[:5]}


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    at = (len(sorted_values) - 1) * q / 100
    low = int(at)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (at - low)


def ratios(rows: list[dict], sizes: list[str], levels: list[int]) -> list[dict]:
    """twostep / LibreTranslate at each size and level, against the targets (each size's own)."""
    by = {(r["size"], r["engine"], r["clients"]): r for r in rows}
    out = []
    for size, clients in ((size, clients) for size in sizes for clients in levels):
        lt, ts = by.get((size, "libretranslate", clients)), by.get((size, "twostep", clients))
        if lt is None or ts is None or not lt["ok"] or not ts["ok"]:
            continue
        row = {"size": size, "clients": clients, "throughput": ts["requests_per_s"] / lt["requests_per_s"],
               "sentences": ts["sentences_per_s"] / lt["sentences_per_s"], "p50": ts["p50_ms"] / lt["p50_ms"],
               "p99": ts["p99_ms"] / lt["p99_ms"]}
        for what, (at, target) in TARGETS.items():
            if at == clients:
                met = row[what] >= target if what == "throughput" else row[what] < target
                row[f"{what}_target"], row[f"{what}_met"] = target, met
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------------- reporting


def report(meta: dict, same: dict, rows: list[dict], ratio_rows: list[dict]) -> str:
    lines = [f"CPU: {meta['cpu']} ({meta['cpu_features']}), {meta['cores']} cores; {meta['date']}; load average "
             f"before/after {meta['load_average']['before']}/{meta['load_average']['after']}; at most "
             f"{meta['max_requests']} requests or {meta['max_seconds']:.0f} s per engine and level, in "
             f"{meta['rounds']} rounds (the engines alternating), pooled",
             f"Each engine: CTranslate2 / ONNX Runtime on {meta['threads']} intra-op threads; LibreTranslate "
             f"{meta['versions'].get('libretranslate', '-')} under waitress (4 threads), its MiniSBD splitter "
             "replaced by a rule splitter (after . ! ? before whitespace) that splits every text sent as twostep's "
             f"sentencex does; twostep `serve` of `export --dtype {meta['dtype']}` artifacts, "
             f"{'one server for all pairs' if meta['serve_many'] else 'one server a pair (the client routes)'}; "
             f"Mastodon requests' source {meta['mastodon_source']}. Pairs: {meta['pairs']}.", ""]
    if same.get("compared"):
        lines += ["| same requests (one at a time) | requests | identical translatedText |", "|---|---:|---:|"]
        for kind, r in same["kinds"].items():
            lines.append(f"| {kind} | {r['requests']} | {r['identical']} ({r['identical_rate']:.0%}) |")
        lines.append("")
    lines += ["| model size | clients | engine | requests | requests/s | sentences/s | p50 ms | p99 ms | errors |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['size']} | {r['clients']} | {LABELS[r['engine']]} | {r['ok']} | "
                     f"{r['requests_per_s']:.2f} | {r['sentences_per_s']:.2f} | {r['p50_ms']:,.0f} | "
                     f"{r['p99_ms']:,.0f} | {r['errors']} |")
    names = list(dict.fromkeys(name for r in rows for name in r.get("p50_ms_by_pair", {})))
    if len(names) > len(meta.get("sizes", ())):  # a size of several pairs: each pair's p50
        lines += ["", "| model size | clients | engine | " + " | ".join(f"{n} p50 ms" for n in names) + " |",
                  "|---|---:|---|" + "---:|" * len(names)]
        for r in rows:
            cells = [f"{r['p50_ms_by_pair'][n]:,.0f}" if n in r["p50_ms_by_pair"] else "-" for n in names]
            lines.append(f"| {r['size']} | {r['clients']} | {LABELS[r['engine']]} | " + " | ".join(cells) + " |")
    if ratio_rows:
        lines += ["", "| model size | clients | twostep / LibreTranslate requests/s | sentences/s | p50 | p99 | target "
                  "| met |", "|---|---:|---:|---:|---:|---:|---|---|"]
        for r in ratio_rows:
            target, met = "-", "-"
            if "throughput_target" in r:
                target, met = f">= {r['throughput_target']:.0f}x requests/s", "yes" if r["throughput_met"] else "NO"
            if "p50_target" in r:
                target, met = "lower p50", "yes" if r["p50_met"] else "NO"
            lines.append(f"| {r['size']} | {r['clients']} | {r['throughput']:.2f}x | {r['sentences']:.2f}x | "
                         f"{r['p50']:.2f}x | {r['p99']:.2f}x | {target} | {met} |")
    return "\n".join(lines)


def cpu_info() -> tuple[str, str]:
    from benchmarks.argos import cpu_features
    from benchmarks.marian import cpu_model

    return cpu_model(), cpu_features()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", default="1,8,32", help="closed-loop clients per level, comma-separated")
    p.add_argument("--requests", type=int, default=200, help="at most this many requests per engine and level")
    p.add_argument("--seconds", type=float, default=60, help="at most this long per engine and level (then the "
                   "requests in flight are awaited)")
    p.add_argument("--rounds", type=int, default=3, help="each level's requests and seconds in this many rounds, "
                   "the engines alternating, pooled (so that the machine's drift falls on both alike)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads of each engine's model")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    p.add_argument("--lt-venv", type=Path, default=DEFAULT_VENV, help="LibreTranslate's own venv (made if absent)")
    p.add_argument("--no-install", action="store_true", help="never install LibreTranslate: skip it if its venv "
                   "lacks it")
    p.add_argument("--dtype", choices=("fp32", "int8"), default="fp32", help="twostep export --dtype")
    p.add_argument("--mastodon-source", choices=("explicit", "auto"), default="auto",
                   help="the Mastodon requests' source: the real one, or auto (needs twostep's language detection)")
    p.add_argument("--tiny", action="store_true", help="only the tiny en-fr and fr-en models (seconds)")
    p.add_argument("--work", type=Path, help="packages and artifacts are built here once and reused (default: "
                   "~/.cache/twostep-bench/libretranslate-work)")
    p.add_argument("--json", type=Path, help="write every number here")
    p.add_argument("--markdown", type=Path, help="write the tables here")
    p.add_argument("--build-packages", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--launch-libretranslate", action="store_true", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    if args.launch_libretranslate:
        launch_libretranslate(rest)
        return 0
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.build_packages:
        build_packages(args.build_packages, args.tiny)
        return 0

    def log(msg: str) -> None:
        print(f"[libretranslate {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    levels = [int(c) for c in args.clients.split(",") if c.strip()]
    engines_wanted = [e.strip() for e in args.engines.split(",") if e.strip()]
    if set(engines_wanted) - set(ENGINES):
        p.error(f"unknown engines {sorted(set(engines_wanted) - set(ENGINES))}; choose from {', '.join(ENGINES)}")
    pairs = [pair for pair in PAIRS if not (args.tiny and pair.base)]
    work = args.work or Path.home() / ".cache" / "twostep-bench" / "libretranslate-work"
    work = work / ("tiny" if args.tiny else "full")
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    check_splitting(pairs)

    skipped: dict[str, str] = {}
    if "libretranslate" in engines_wanted and not lt_installed(args.lt_venv):
        if args.no_install:
            skipped["libretranslate"] = (f"no libretranslate=={LT_VERSION} in {args.lt_venv} (--no-install); run "
                                         "without --no-install to make that venv")
            engines_wanted.remove("libretranslate")
        else:
            install_libretranslate(args.lt_venv, log)
    paths = prepare(work, pairs, args.dtype, log)

    texts, mix = text_requests(pairs), load_requests(pairs, args.mastodon_source)
    sizes = [size for size in SIZES if any(q.size == size for q in pairs)]
    engines: dict[str, Engine] = {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the servers are closed on the way out
    load_before = load_average()
    rows: list[dict] = []
    try:
        if "libretranslate" in engines_wanted:
            log("starting LibreTranslate")
            server = start_libretranslate(args.lt_venv, paths["packages"], pairs, args.threads, logs)
            engines["libretranslate"] = Engine("libretranslate", dict.fromkeys((q.name for q in pairs), server.url),
                                               [server])
        if "twostep" in engines_wanted:
            log(f"starting twostep serve ({'one server' if SERVE_MANY else 'a server a pair'})")
            servers = start_twostep({q.name: paths[q.name] for q in pairs}, args.threads, logs)
            engines["twostep"] = Engine("twostep", {n: s.url for n, s in servers.items()}, list(servers.values()))
        log(f"same requests, one at a time: {len(texts)} texts and {len(mix)} load requests to each engine")
        same = asyncio.run(compare(engines, texts + unique(mix)))
        for size in sizes:
            sized = [r for r in mix if r.pair.size == size]
            for i, clients in enumerate(levels):
                runs: dict[str, list[dict]] = {name: [] for name in engines}
                for r in range(args.rounds):
                    order = list(engines) if (i + r) % 2 == 0 else list(engines)[::-1]
                    for name in order:
                        start = sum(run["sent"] for run in runs[name])
                        run = asyncio.run(closed_loop(engines[name], sized, clients, args.requests // args.rounds,
                                                      args.seconds / args.rounds, start))
                        runs[name].append(run)
                        log(f"{size}, {clients} clients, round {r + 1}/{args.rounds}, {name}: "
                            f"{len(run['latencies'])} answered in {run['wall_s']:.1f} s, {len(run['errors'])} errors")
                rows += [{"size": size, **summary(name, clients, runs[name])} for name in engines]
    finally:
        for engine in engines.values():
            engine.close()
    rows.sort(key=lambda r: (SIZES.index(r["size"]), r["clients"], ENGINES.index(r["engine"])))

    cpu, features = cpu_info()
    meta = {"cpu": cpu, "cpu_features": features, "cores": os.cpu_count(), "threads": args.threads,
            "dtype": args.dtype, "serve_many": SERVE_MANY, "mastodon_source": args.mastodon_source,
            "pairs": ", ".join(f"{q.name} ({'Argos-sized, random, int8' if q.base else 'tiny, int8'})" for q in pairs),
            "clients": levels, "sizes": sizes, "max_requests": args.requests, "max_seconds": args.seconds,
            "rounds": args.rounds,
            "date": time.strftime("%Y-%m-%d %H:%M"), "python": sys.version.split()[0], "skipped": skipped,
            "versions": lt_version_info(args.lt_venv) if "libretranslate" in engines else {},
            "load_mix": {kind: sum(r.kind == kind for r in mix) for kind in ("mastodon", "libretranslatepy")},
            "command": " ".join(["python -m benchmarks.libretranslate", *(argv if argv is not None else sys.argv[1:])]),
            "work": str(work), "load_average": {"before": load_before, "after": load_average()}}
    eos_fit = work / "packages" / "build-en-es" / "eos_fit.json"
    if eos_fit.is_file():
        meta["eos_fit"] = json.loads(eos_fit.read_text())
    ratio_rows = ratios(rows, sizes, levels)
    table = report(meta, same, rows, ratio_rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "same": same, "rows": rows, "ratios": ratio_rows}, indent=2))
    return 0


def unique(requests: list[Request]) -> list[Request]:
    seen, out = set(), []
    for r in requests:
        key = json.dumps(r.describe(), sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def load_average() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


if __name__ == "__main__":
    sys.exit(main())
