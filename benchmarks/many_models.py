"""Many models in one `twostep serve`: what a loaded model costs in memory, one model's throughput beside idle and
busy others, and a server of many Argos pairs starting, in one run.

    python -m benchmarks.many_models [--work DIR] [--size tiny|base] [--pairs 50] [--max-loaded 4]
                                     [--clients 1,8,32] [--seconds S] [--runs 3] [--artifact DIR]
                                     [--json OUT] [--markdown OUT]

The models are Argos Translate packages as argos-train makes them (benchmarks/opennmt_py.py): an OpenNMT-py
checkpoint with random weights (xavier), converted by CTranslate2's converter with int8 quantization, packaged,
then `twostep import` + `twostep export` (fp32, its default). Sizes: tiny (d_model 32, 2+2 layers, 300 pieces) and
base (argos-train's Transformer: d_model 512, 6+6 layers, 8 heads, d_ff 2048, a shared vocabulary of 32,000
pieces). The generator's </s> bias is set high, so a text request decodes one token then </s> (the model is
random: a text's answer is only there to show the pair answered); the throughput requests suppress </s> and
decode exactly 32 tokens. `--artifact DIR`: an exported Argos package of one pair (any size) instead of building
the `--size` model (the tests give their session's tiny one).

One model is exported per size, once (import and export are timed); each pair's artifact is that folder with its
files hard-linked and its manifest.json rewritten: the tokenizer's `languages` (the source and target code, the
defaults, and the standard aliases that export writes beside them) and nothing else. The manifest's `files`
hashes cover the files, not the manifest itself: the loader checks every file and takes the copies. Pairs:
en -> X and X -> en for ISO 639-1 codes X (LANGUAGES), in that order, as many as `--pairs`.

1. Memory, both sizes: the server's RSS (/proc/PID/status VmRSS) with k = 1, 2, 3 models, each a server of its
   first k pairs (all loaded at start), at ready and after one text request to each pair (the first request
   grows ONNX Runtime's arenas); the cost of a loaded model is the slope, (RSS(3) - RSS(1)) / 2.
2. Throughput, `--size`: closed-loop clients (aiohttp) of POST /v1/translate, 24 random source ids, 32 tokens
   decoded with the package's decoding (argostranslate's: beam 4, length penalty 0.2), for `--seconds` each,
   median of `--runs`. Three servers, alive together, the order rotated from run to run: one model; three models
   (default threads: ONNX Runtime's, one per core, in each model's session); three models with `--threads 1`.
   Workloads: C clients of the first pair (the other models idle), and C clients of each of the three pairs at
   once (3C clients: three models busy on the same cores).
3. A server of `--pairs` pairs (`--size`), `--max-loaded`: time from the process's start to /readyz 200, RSS at
   ready, one /translate request per pair (each loads its model on first use, the least recently used leaving),
   RSS after, a pivoted pair (two models through en), the pairs /v1/languages lists (direct and pivoted), and the
   models loaded at the end (the log's "(N loaded)" lines).

Server and clients share this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import httpx

from benchmarks.argos import cpu_features, small_spm
from benchmarks.marian import cpu_model, load_average, versions
from benchmarks.opennmt_py import ARGOS, EOS, SPECIALS, Size, argos_package
from twostep.artifact import load_artifact

TWOSTEP = [sys.executable, "-m", "twostep.cli"]
# ISO 639-1 codes beside en, each a language of its own to langcodes (no zh/pt: LibreTranslate renames them)
LANGUAGES = ("ar", "az", "ca", "cs", "da", "de", "el", "eo", "es", "fa", "fi", "fr", "ga", "he", "hi", "hu", "id",
             "it", "ja", "ko", "nl", "pl", "ru", "sk", "sv", "tr", "uk")
PIVOT = "en"
SOURCE_IDS, NEW_TOKENS = 24, 32  # a throughput request: random source ids, tokens decoded (</s> suppressed)
TEXT = "The quick brown fox jumps over the lazy dog."


@dataclass(frozen=True)
class ModelSize:
    name: str
    vocab: int
    size: Size


SIZES = {"tiny": ModelSize("tiny", 300, Size(d_model=32, n_heads=4, d_ff=64, n_layers=2)),
         "base": ModelSize("base", 32000, ARGOS)}


def log(msg: str) -> None:
    print(f"[many_models {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pairs_of(n: int) -> list[tuple[str, str]]:
    """en -> X, X -> en for the codes in order: the first n."""
    if n > 2 * len(LANGUAGES):
        raise SystemExit(f"--pairs: at most {2 * len(LANGUAGES)} (en to and from {len(LANGUAGES)} languages)")
    return [pair for x in LANGUAGES for pair in ((PIVOT, x), (x, PIVOT))][:n]


# ---------------------------------------------------------------------------------------------- the artifacts


def build(work: Path, model: ModelSize) -> dict:
    """`work`/art: the size's Argos package imported and exported once (reused when there); with the seconds that
    each step took."""
    import torch

    from benchmarks.opennmt_py import build_model, convert_opennmt_py, init_glorot, save_checkpoint
    from twostep.exporter.export import export
    from twostep.model.sources import import_model

    done = work / "build.json"
    if done.is_file() and (work / "art" / "manifest.json").is_file():
        return json.loads(done.read_text())
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    seconds = {}
    started = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        net = build_model(model.vocab, model.size, add_qkvbias=False).eval()
        init_glorot(net)
        with torch.no_grad():
            net.generator.bias[EOS] = 100.0  # a text ends after one token (min_new_tokens 1); see the docstring
        params = sum(p.numel() for p in net.parameters())
        vocab = SPECIALS + [f"\u2581t{i}" for i in range(len(SPECIALS), model.vocab)]
        ckpt = save_checkpoint(net, vocab, model.size, False, work / "opennmt-py" / "model.pt")
    finally:
        torch.set_num_threads(threads)
    ct2 = convert_opennmt_py(ckpt, work / "ct2-int8", "int8")  # as argos-train converts
    package = argos_package(ct2, small_spm(work / "sentencepiece.model"), work / "package", *pairs_of(1)[0])
    seconds["checkpoint_and_package"] = time.perf_counter() - started
    log(f"{model.name}: twostep import {package.name}")
    t0 = time.perf_counter()
    import_model(package, work / "ckpt")
    seconds["import"] = time.perf_counter() - t0
    log(f"{model.name}: twostep export")
    t0 = time.perf_counter()
    export(work / "ckpt", work / "art")
    seconds["export"] = time.perf_counter() - t0
    out = {"seconds": seconds, "params": params, "art_mib": folder_mib(work / "art"),
           "files": sorted(p.name for p in (work / "art").iterdir())}
    done.write_text(json.dumps(out, indent=1))
    return out


def given(art: Path) -> dict:
    """What build says of an artifact made elsewhere: its size on disk; no seconds, no parameter count."""
    return {"seconds": None, "params": None, "art_mib": folder_mib(art), "artifact": str(art),
            "files": sorted(p.name for p in art.iterdir())}


def folder_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def pair_copy(art: Path, out: Path, source: str, target: str) -> Path:
    """`art` as the artifact of source -> target: its files hard-linked (copied where links fail), its manifest's
    tokenizer languages renamed (with the standard aliases export writes beside them), nothing else."""
    from twostep.artifact.tokenizer import Languages, TargetLanguage

    manifest = json.loads((art / "manifest.json").read_text())
    languages = manifest["tokenizer"]["languages"]
    source_ids, = languages["source"].values()
    target_ids, = languages["target"].values()
    entry = TargetLanguage(tuple(target_ids["source"]), tuple(target_ids["decoder"]))
    # as export writes them, with their standard aliases
    manifest["tokenizer"]["languages"] = Languages({source: tuple(source_ids)}, {target: entry}, source,
                                                   target).to_json()

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(art, out, copy_function=link, ignore=shutil.ignore_patterns("manifest.json"))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return out


def pair_folders(art: Path, out: Path, pairs: list[tuple[str, str]]) -> list[Path]:
    """One artifact per pair under `out` (only these), named in the pairs' order."""
    shutil.rmtree(out, ignore_errors=True)
    return [pair_copy(art, out / f"{i:02d}-{s}_{t}", s, t) for i, (s, t) in enumerate(pairs)]


# ---------------------------------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`twostep serve PATHS... ARGS` on a free loopback port, ready (/readyz 200) when made; its output lines in
    `log`; stopped with SIGTERM on leaving."""

    def __init__(self, paths: list[Path], *args, ready_s: float = 900):
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        started = time.perf_counter()
        self.proc = subprocess.Popen([*TWOSTEP, "serve", *map(str, paths), "--host", "127.0.0.1", "--port", str(port),
                                      *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.log: list[str] = []
        self.drain = threading.Thread(target=lambda: self.log.extend(self.proc.stdout), daemon=True)
        self.drain.start()
        while not self.ready():
            if self.proc.poll() is not None or time.perf_counter() - started > ready_s:
                self.close()
                raise RuntimeError(f"the server did not become ready ({self.proc.returncode}):\n{''.join(self.log)}")
            time.sleep(0.05)
        self.ready_s = time.perf_counter() - started

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def rss_mib(self, field: str = "VmRSS") -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.M).group(1)) / 1024

    def loaded(self) -> list[int]:
        """The count of loaded models after each load, from the log's "loaded ... (N loaded)" lines."""
        return [int(n) for n in re.findall(r"\((\d+) loaded\)", "".join(self.log))]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.drain.join(10)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def translate_text(url: str, source: str, target: str) -> tuple[int, str]:
    """LibreTranslate's /translate for one pair: the status and the translated text (or the error)."""
    r = httpx.post(f"{url}/translate", json={"q": TEXT, "source": source, "target": target, "format": "text"},
                   timeout=300)
    body = r.json()
    return r.status_code, body.get("translatedText", body.get("error", ""))


# ---------------------------------------------------------------------------------------------- 1. memory


def memory(art: Path, work: Path, pairs: list[tuple[str, str]]) -> dict:
    """RSS of servers of the first k = 1, 2, 3 pairs, at ready and after one request to each pair."""
    folders = pair_folders(art, work / "memory-pairs", pairs[:3])
    rss = {}
    for k in (1, 2, 3):
        with Server(folders[:k]) as server:
            ready = server.rss_mib()
            statuses = [translate_text(server.url, s, t)[0] for s, t in pairs[:k]]
            if statuses != [200] * k:
                raise RuntimeError(f"k={k}: statuses {statuses}\n{''.join(server.log)}")
            rss[k] = {"ready_mib": ready, "after_request_mib": server.rss_mib(), "ready_s": server.ready_s}
        log(f"memory, {k} loaded: {rss[k]}")
    per_model = {key: (rss[3][key] - rss[1][key]) / 2 for key in ("ready_mib", "after_request_mib")}
    return {"rss": rss, "per_model": per_model}


# ---------------------------------------------------------------------------------------------- 2. throughput


def bodies(pair: tuple[str, str], vocab: int, n: int = 64, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"ids": [[rng.randrange(len(SPECIALS), vocab) for _ in range(SOURCE_IDS)]], "src_lang": pair[0],
             "tgt_lang": pair[1], "max_new_tokens": NEW_TOKENS, "suppress_eos": True} for _ in range(n)]


async def closed_loop(url: str, work: list[list[dict]], seconds: float) -> dict:
    """One closed-loop client per list of `work` (its bodies, in a cycle), sending until `seconds` have passed;
    throughput over the wall time until the last answer, per pair and in all."""
    latencies: list[float] = []
    tokens: dict[str, int] = {}
    errors = 0
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=len(work)), timeout=timeout) as session:
        async def client(mine: list[dict], offset: int):
            nonlocal errors
            i = offset
            while time.perf_counter() < deadline:
                body = mine[i % len(mine)]
                i += 1
                t0 = time.perf_counter()
                async with session.post("/v1/translate", json=body) as r:
                    reply = await r.json()
                if r.status != 200:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - t0)
                pair = f"{body['src_lang']}-{body['tgt_lang']}"
                tokens[pair] = tokens.get(pair, 0) + sum(len(h[0]["tokens"]) for h in reply["translations"])

        started = time.perf_counter()
        deadline = started + seconds
        await asyncio.gather(*(client(mine, i) for i, mine in enumerate(work)))
        wall = time.perf_counter() - started
    return {"requests_per_s": len(latencies) / wall, "tokens_per_s": sum(tokens.values()) / wall,
            "p50_ms": statistics.median(latencies) * 1000 if latencies else 0.0,
            "per_pair_tokens_per_s": {pair: n / wall for pair, n in sorted(tokens.items())}, "errors": errors}


WORKLOADS = {  # name: (the server, its pairs busy)
    "1 model": ("one", 1),
    "3 loaded, 1 busy": ("three", 1),
    "3 loaded, 3 busy": ("three", 3),
    "3 loaded, 1 busy, --threads 1": ("three-t1", 1),
    "3 loaded, 3 busy, --threads 1": ("three-t1", 3),
}


def throughput(art: Path, work: Path, pairs: list[tuple[str, str]], vocab: int, levels: list[int], seconds: float,
               runs: int) -> dict:
    folders = pair_folders(art, work / "throughput-pairs", pairs[:3])
    pools = [bodies(pair, vocab, seed=i) for i, pair in enumerate(pairs[:3])]
    servers = {"one": Server(folders[:1]), "three": Server(folders), "three-t1": Server(folders, "--threads", 1)}
    models = {"one": 1, "three": 3, "three-t1": 3}
    results: dict[str, dict[int, list[dict]]] = {name: {c: [] for c in levels} for name in WORKLOADS}
    try:
        for name, server in servers.items():  # warm up: every model, a few requests
            asyncio.run(closed_loop(server.url, [pool[:2] for pool in pools[:models[name]]], 0.1))
        names = list(WORKLOADS)
        for run in range(runs):
            order = names[run % len(names):] + names[:run % len(names)]
            for clients in levels:
                for name in order:
                    server, busy = WORKLOADS[name]
                    work_ = [pools[i][(j * 7) % len(pools[i]):] + pools[i] for i in range(busy) for j in range(clients)]
                    r = asyncio.run(closed_loop(servers[server].url, work_, seconds))
                    results[name][clients].append(r)
                    log(f"run {run + 1}/{runs}, {clients} clients a pair, {name}: {r['tokens_per_s']:.0f} tokens/s, "
                        f"p50 {r['p50_ms']:.0f} ms")
    finally:
        for server in servers.values():
            server.close()

    def median(rs: list[dict]) -> dict:
        out = {key: statistics.median(r[key] for r in rs) for key in ("requests_per_s", "tokens_per_s", "p50_ms")}
        out["per_pair_tokens_per_s"] = {pair: statistics.median(r["per_pair_tokens_per_s"].get(pair, 0) for r in rs)
                                        for pair in rs[0]["per_pair_tokens_per_s"]}
        out["errors"] = sum(r["errors"] for r in rs)
        return out

    return {"levels": levels, "seconds": seconds, "runs": runs, "source_ids": SOURCE_IDS, "new_tokens": NEW_TOKENS,
            "workloads": {name: {c: median(rs) for c, rs in by.items()} for name, by in results.items()}}


# ---------------------------------------------------------------------------------------------- 3. many pairs


def many_pairs(art: Path, work: Path, pairs: list[tuple[str, str]], max_loaded: int) -> dict:
    t0 = time.perf_counter()
    folder = work / "pairs"
    pair_folders(art, folder, pairs)
    copy_s = time.perf_counter() - t0
    log(f"{len(pairs)} pair artifacts in {copy_s:.1f} s; serving them, --max-loaded {max_loaded}")
    with Server([folder], "--max-loaded", max_loaded) as server:
        out = {"pairs": len(pairs), "max_loaded": max_loaded, "copy_s": copy_s, "ready_s": server.ready_s,
               "rss_ready_mib": server.rss_mib(), "loaded_at_ready": (server.loaded() or [0])[-1]}
        log(f"ready in {server.ready_s:.1f} s, RSS {out['rss_ready_mib']:.0f} MiB")
        failed, seconds = [], []
        for s, t in pairs:
            t0 = time.perf_counter()
            status, text = translate_text(server.url, s, t)
            seconds.append(time.perf_counter() - t0)
            if status != 200:
                failed.append({"pair": f"{s}-{t}", "status": status, "error": text})
        out.update(answered=len(pairs) - len(failed), failed=failed, translate_s=sum(seconds),
                   request_s_median=statistics.median(seconds), request_s_max=max(seconds),
                   rss_after_mib=server.rss_mib(), rss_peak_mib=server.rss_mib("VmHWM"))
        sources = [s for s, t in pairs if t == PIVOT]
        if len(sources) >= 2:  # X -> Y through en: two models
            status, _ = translate_text(server.url, sources[0], sources[1])
            out["pivoted_request"] = {"pair": f"{sources[0]}-{sources[1]}", "status": status}
        listed = httpx.get(f"{server.url}/v1/languages", timeout=30).json()["source"]
        # each source's targets, and among them those reached through the pivot
        out["languages"] = {"sources": len(listed),
                            "direct_pairs": sum(len(x["targets"]) - len(x["pivoted"]) for x in listed),
                            "pivoted_pairs": sum(len(x["pivoted"]) for x in listed),
                            "libretranslate_sources": len(httpx.get(f"{server.url}/languages", timeout=30).json())}
        loads = server.loaded()
        out.update(loads=len(loads), loaded_max=max(loads, default=0), loaded_end=(loads or [0])[-1],
                   unloads=sum("unloading" in line for line in server.log))
        log(f"{out['answered']}/{len(pairs)} answered; RSS after {out['rss_after_mib']:.0f} MiB; "
            f"{out['loads']} loads, at most {out['loaded_max']} loaded")
    return out


# ---------------------------------------------------------------------------------------------- the report


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores ({m['cpu_features']}); onnxruntime "
             f"{m['versions'].get('onnxruntime', '?')}; load average {m['load_average']['before']} before, "
             f"{m['load_average']['after']} after.", "",
             "#### What a loaded model costs: the server's RSS (MiB) with k models loaded", "",
             "| model | params | artifact on disk MiB | k=1 ready | k=2 | k=3 | per model, ready | k=1 after a request "
             "each | k=2 | k=3 | per model, after |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, x in report["memory"].items():
        b, r = report["build"][name], x["rss"]
        params = f"{b['params'] / 1e6:.1f} M" if b["params"] else "?"
        lines.append(f"| {name} | {params} | {b['art_mib']:.0f} | "
                     + " | ".join(f"{r[k]['ready_mib']:.0f}" for k in r)
                     + f" | **{x['per_model']['ready_mib']:.0f}** | "
                     + " | ".join(f"{r[k]['after_request_mib']:.0f}" for k in r)
                     + f" | **{x['per_model']['after_request_mib']:.0f}** |")
    t = report["throughput"]
    lines += ["", f"#### Throughput ({report['size']}): tokens/s (p50 latency ms), {t['source_ids']} source ids -> "
              f"{t['new_tokens']} tokens a request, beam 4; C closed-loop clients per busy pair, {t['seconds']:g} s "
              f"a run, median of {t['runs']}", "",
              "| C | " + " | ".join(t["workloads"]) + " |", "|---" * (len(t["workloads"]) + 1) + "|"]
    for c in t["levels"]:
        cells = []
        for by in t["workloads"].values():
            x = by[c]
            per = x["per_pair_tokens_per_s"]
            split = f" [{' + '.join(f'{v:.0f}' for v in per.values())}]" if len(per) > 1 else ""
            cells.append(f"{x['tokens_per_s']:.0f}{split} ({x['p50_ms']:.0f})")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    errors = sum(x["errors"] for by in t["workloads"].values() for x in by.values())
    lines += ["", f"Three busy: total [each pair's]. Errors: {errors}."]
    p = report["many"]
    b = report["build"][report["size"]]["seconds"]
    lines += ["", f"#### A server of {p['pairs']} Argos pairs ({report['size']}), --max-loaded {p['max_loaded']}", "",
              "| | |", "|---|---|",
              "| one export (import + export) | "
              + (f"{b['import']:.1f} s + {b['export']:.1f} s |" if b else "not measured (--artifact) |"),
              f"| {p['pairs']} pair artifacts (hard links, manifest rewritten) | {p['copy_s']:.1f} s |",
              f"| start to /readyz 200 | {p['ready_s']:.1f} s ({p['loaded_at_ready']} loaded) |",
              f"| RSS at ready | {p['rss_ready_mib']:.0f} MiB |",
              f"| one /translate per pair | {p['answered']}/{p['pairs']} answered, {p['translate_s']:.1f} s in all "
              f"(median {p['request_s_median']:.2f} s, max {p['request_s_max']:.2f} s) |",
              f"| RSS after (peak) | {p['rss_after_mib']:.0f} MiB ({p['rss_peak_mib']:.0f}) |",
              f"| models loaded | {p['loads']} loads, at most {p['loaded_max']}, {p['loaded_end']} at the end; "
              f"{p['unloads']} unloaded |",
              f"| /v1/languages | {p['languages']['sources']} sources, {p['languages']['direct_pairs']} direct pairs, "
              f"{p['languages']['pivoted_pairs']} pivoted |"]
    if "pivoted_request" in p:
        lines.append(f"| a pivoted request ({p['pivoted_request']['pair']}) | {p['pivoted_request']['status']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/twostep-many-models"),
                        help="models are built here once and reused")
    parser.add_argument("--size", choices=SIZES, default="base", help="the model of the throughput and many-pairs "
                        "parts (memory is measured for both sizes)")
    parser.add_argument("--pairs", type=int, default=50)
    parser.add_argument("--max-loaded", type=int, default=4)
    parser.add_argument("--clients", default="1,8,32", help="closed-loop clients per busy pair, comma-separated")
    parser.add_argument("--seconds", type=float, default=8.0, help="each throughput run's")
    parser.add_argument("--runs", type=int, default=3, help="throughput runs (the median is reported)")
    parser.add_argument("--artifact", type=Path, help="an exported Argos artifact of one pair: the --size model "
                        "(not built)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    pairs = pairs_of(args.pairs)
    if len(pairs) < 3:
        parser.error("--pairs: at least 3 (memory and throughput use the first three)")
    levels = [int(c) for c in args.clients.split(",") if c.strip()]
    report: dict = {"size": args.size, "pairs": [f"{s}-{t}" for s, t in pairs],
                    "sizes": {name: {**asdict(m), "size": asdict(m.size)} for name, m in SIZES.items()},
                    "command": " ".join(["python -m benchmarks.many_models",
                                         *(sys.argv[1:] if argv is None else argv)])}
    load_before = load_average()
    report["build"], report["memory"] = {}, {}
    for name in dict.fromkeys(["tiny", args.size]):
        if args.artifact and name == args.size:
            report["build"][name], art = given(args.artifact), args.artifact
        else:
            report["build"][name], art = build(args.work / name, SIZES[name]), args.work / name / "art"
        log(f"{name}: {report['build'][name]}")
        report["memory"][name] = memory(art, args.work / name, pairs)
    work = args.work / args.size
    vocab = load_artifact(art, check_hashes=False).config.src_vocab_size
    report["throughput"] = throughput(art, work, pairs, vocab, levels, args.seconds, args.runs)
    report["many"] = many_pairs(art, work, pairs, args.max_loaded)
    report["machine"] = {"cpu": cpu_model(), "cores": os.cpu_count(), "cpu_features": cpu_features(),
                         "versions": versions("onnxruntime", "numpy", "twostep"), "python": sys.version.split()[0],
                         "date": time.strftime("%Y-%m-%d %H:%M"),
                         "load_average": {"before": load_before, "after": load_average()}}
    table = markdown(report)
    print(json.dumps(report, indent=1))
    print(table, file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
