"""Load test of `twostep serve`: closed-loop clients (asyncio + aiohttp) against a real server process.

    python -m benchmarks.serve_load [--work DIR] [--presets demo,base] [--concurrency 1,8,32,64]
                                    [--requests 96] [--markdown FILE]
    python -m benchmarks.serve_load --scenario clients [--clients 32] [--requests 96] [--stream-tokens 48]
                                    [--document-sentences 20] [--repeats 10] [--markdown FILE]
    python -m benchmarks.serve_load --scenario mixed [--presets demo,base] [--decoders plain,inplace]
                                    [--modes static,inflight,express] [--express-tokens 9]
                                    [--mixed-requests 256] [--rounds 2] [--threads 2] [--backend ort-cuda]
                                    [--markdown FILE]

Per preset (the bundled demo model; the paper's base model with random weights, vocab 32000):
1. offline: `twostep bench` at batch 32 (the throughput the server should approach);
2. one request at a time through the Python API (a Translator, one sentence per call): the baseline a
   service without batching gets;
3. the server under C closed-loop clients, each sending one sentence and waiting for its answer:
   requests/s, generated tokens/s, latency p50/p95/p99, mean batch size (from /metrics);
4. mixed lengths: sources of 5-60 tokens, each decoding 2 x its length + 16 tokens: short (<= 20 source
   tokens) and long (>= 40) sentences' latency, unloaded (1 client) and loaded (32 clients);
5. overload: twice the largest concurrency against a queue of half of it: 503s, errors, lost requests.

`--scenario clients` measures what the clients of documents and streams see, on the demo model's sentences (each
decoding `--stream-tokens` tokens, eos suppressed, so that an answer takes long enough to stream): time to the
first streamed delta against time to the whole answer, streamed and not, at `--clients` closed-loop clients
(32); and a document of `--document-sentences` (20) sentences as one request (split by the server) against the
same sentences as that many requests sent at once, and one after another, on an otherwise idle server
(median of `--repeats`).

`--scenario mixed` runs only the batching comparison: one server per mode of `--modes` (static: `twostep serve
--batching static`; inflight: `--batching inflight`; express: in flight with `--express-tokens`, by default
the short sentences' 9), otherwise alike, one after the other in the same run, `--rounds` times, the order
reversed every other round. Each gets the same mixed-length workload (sources of 5-60 random ids, each
decoding 2 x its length + 16 tokens) from 32 closed-loop clients, and, before it, the short sentences (< 10
source tokens) of that workload one at a time (their unloaded latency). Reported per mode: the short
sentences' p50 latency loaded and unloaded and their ratio (target <= 2), requests/s and generated tokens/s
and their ratio to static's (target >= 1), and the mean rows per decoder step (from /metrics).

Base preset requests are 32 random source tokens decoding exactly 32 tokens (suppress_eos), like the offline
bench; demo requests are test-split sentences decoded to their eos. Server and clients share this machine's
cores, so the server's numbers include the clients' cost. The client is aiohttp: httpx's AsyncClient costs
so much CPU per request at 32 connections (46 requests/s against aiohttp's 327 on the same server, measured
here) that it, not the server, set the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

console = Console(stderr=True)
TWOSTEP = [sys.executable, "-m", "twostep.cli"]


def prepare(work: Path, preset: str, inplace: bool = False) -> Path:
    """The preset's artifact, with the in-place decoder variant or (`--no-inplace-cache`) without."""
    art = work / f"{preset}-{'inplace' if inplace else 'art'}"
    if (art / "manifest.json").is_file():
        return art
    if preset == "demo":
        ckpt = Path(__file__).resolve().parents[1] / "twostep" / "demo" / "model"
    else:
        ckpt = work / f"{preset}-ckpt"
        subprocess.run([*TWOSTEP, "init", "--preset", preset, "--vocab", "32000", "--out", str(ckpt), "--force"],
                       check=True, capture_output=True)
    subprocess.run([*TWOSTEP, "export", str(ckpt), "--out", str(art), "--force",
                    "--inplace-cache" if inplace else "--no-inplace-cache"], check=True, capture_output=True)
    return art


def workload(preset: str, art: Path, n: int, seed: int = 0) -> list[dict]:
    """Request bodies: one sentence each."""
    if preset == "demo":
        from twostep.model.tasks import get_task

        sources = [s for s, _ in get_task("numbers-en-de").split("test")]
        return [{"text": [sources[i % len(sources)]]} for i in range(n)]
    rng = np.random.default_rng(seed)
    return [{"ids": [rng.integers(4, 32000, 31).tolist() + [3]], "max_new_tokens": 32, "suppress_eos": True}
            for _ in range(n)]


def mixed(n: int, seed: int = 1) -> list[dict]:
    """Sources of 5-60 random ids, each decoding its default 2 x length + 16 tokens (eos suppressed): short
    sentences have short outputs, long ones long."""
    rng = np.random.default_rng(seed)
    return [{"ids": [rng.integers(4, 250, int(length) - 1).tolist() + [3]], "suppress_eos": True}
            for length in rng.integers(5, 61, n)]


def offline_bench(art: Path) -> float:
    proc = subprocess.run([*TWOSTEP, "bench", str(art), "--backend", "ort-cpu", "--batch", "32", "--src-len", "32",
                           "--new-tokens", "32", "--warmup", "1", "--iters", "3", "--json"],
                          check=True, capture_output=True, text=True)
    return json.loads(proc.stdout)[0]["tokens_per_s"]


def one_at_a_time(art: Path, bodies: list[dict]) -> dict:
    """The Python API without batching: one sentence per call, one call after another."""
    from twostep.runtime.decoding import DecodeOptions
    from twostep.runtime.translator import open_translator

    translator, backend = open_translator(art, threads=2)
    latencies, tokens = [], 0
    with backend:
        started = time.perf_counter()
        for body in bodies:
            options = DecodeOptions(max_new_tokens=body.get("max_new_tokens"),
                                    suppress_eos=body.get("suppress_eos", False))
            sources = body["ids"] if "ids" in body else translator.encode(body["text"])
            t0 = time.perf_counter()
            tokens += sum(len(h[0].tokens) for h in translator.decode_ids(sources, options))
            latencies.append(time.perf_counter() - t0)
        wall = time.perf_counter() - started
    return summary(latencies, tokens, wall, len(bodies))


def summary(latencies: list[float], tokens: int, wall: float, requests: int, **extra) -> dict:
    ms = np.array(latencies) * 1000 if latencies else np.zeros(1)
    return {"requests_per_s": requests / wall, "tokens_per_s": tokens / wall, "p50_ms": float(np.percentile(ms, 50)),
            "p95_ms": float(np.percentile(ms, 95)), "p99_ms": float(np.percentile(ms, 99)), **extra}


class Server:
    threads = 2  # the server's intra-op threads (--threads)

    def __init__(self, art: Path, *args):
        self.proc = subprocess.Popen([*TWOSTEP, "serve", str(art), "--port", "0", "--threads", str(self.threads),
                                      *map(str, args)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in self.proc.stdout:
            found = re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", line)
            if found:
                self.url = found.group(1)
                break
        else:
            raise RuntimeError(f"the server exited ({self.proc.wait()})")
        subprocess.Popen(["cat"], stdin=self.proc.stdout, stdout=subprocess.DEVNULL)  # keep its pipe drained

    def counter(self, *names: str) -> tuple[float, ...]:
        families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{self.url}/metrics").text)}
        return tuple(next(s.value for s in families[name].samples if s.name == name + "_total") for name in names)

    def batches(self) -> tuple[float, float]:
        """Batches started and the sentences they started with (not those that joined them later)."""
        return self.counter("twostep_batches", "twostep_batch_sentences")

    def steps(self) -> tuple[float, float]:
        """Decoder steps run and the rows of sentences they ran for, summed."""
        return self.counter("twostep_decoder_steps", "twostep_decoder_step_rows")

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)


async def closed_loop(url: str, bodies: list[dict], clients: int, time_limit_s: float = 300) -> dict:
    """`clients` workers, each sending the next body and waiting for its answer, until every body was sent."""
    queue = list(reversed(bodies))
    latencies: list[tuple[float, dict]] = []
    counts = {"ok": 0, "503": 0, "errors": 0, "tokens": 0}
    deadline = time.monotonic() + time_limit_s
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=clients), timeout=timeout) as session:
        async def worker():
            while queue and time.monotonic() < deadline:
                body = queue.pop()
                t0 = time.perf_counter()
                try:
                    async with session.post("/v1/translate", json=body) as r:
                        status, reply = r.status, await r.json()
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    counts["errors"] += 1
                    continue
                if status == 200:
                    counts["ok"] += 1
                    counts["tokens"] += sum(len(hyps[0]["tokens"]) for hyps in reply["translations"])
                    latencies.append((time.perf_counter() - t0, body))
                elif status == 503:
                    counts["503"] += 1
                else:
                    counts["errors"] += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - started
    sent = len(bodies) - len(queue)
    counts["lost"] = sent - counts["ok"] - counts["503"] - counts["errors"]
    return {"wall": wall, "latencies": latencies, "sent": sent, **counts}


def run_server_levels(preset: str, art: Path, levels: list[int], n: int, max_wait_ms: float) -> dict:
    out: dict = {"levels": {}}
    with Server(art, "--max-queue", 4096, "--max-batch-rows", 64, "--max-wait-ms", max_wait_ms) as server:
        asyncio.run(closed_loop(server.url, workload(preset, art, 8, seed=9), 4))  # warm up
        for clients in levels:
            bodies = workload(preset, art, max(n, 2 * clients), seed=clients)
            b0, s0 = server.batches()
            r = asyncio.run(closed_loop(server.url, bodies, clients))
            b1, s1 = server.batches()
            out["levels"][clients] = summary([lat for lat, _ in r["latencies"]], r["tokens"], r["wall"], r["ok"],
                                             mean_batch=(s1 - s0) / max(b1 - b0, 1), errors=r["errors"],
                                             lost=r["lost"], refused=r["503"])
            console.print(f"{preset} c={clients}: {out['levels'][clients]}")
        split = {}
        for label, clients in (("unloaded", 1), ("loaded", 32)):
            r = asyncio.run(closed_loop(server.url, mixed(max(n, 96)), clients))
            lengths = [(lat, len(body["ids"][0])) for lat, body in r["latencies"]]
            for kind, keep in (("short", lambda n: n <= 20), ("long", lambda n: n >= 40)):
                ms = [lat * 1000 for lat, length in lengths if keep(length)]
                split[f"{label} {kind}"] = {"p50_ms": float(np.percentile(ms, 50)),
                                            "p95_ms": float(np.percentile(ms, 95)), "n": len(ms)}
        out["mixed"] = split
    overload_clients = 2 * max(levels)
    with Server(art, "--max-queue", max(levels) // 2, "--max-batch-rows", 64, "--max-wait-ms", max_wait_ms) as server:
        r = asyncio.run(closed_loop(server.url, workload(preset, art, 4 * overload_clients, seed=7), overload_clients))
        out["overload"] = {"clients": overload_clients, "queue": max(levels) // 2, "sent": r["sent"], "ok": r["ok"],
                           "refused_503": r["503"], "errors": r["errors"], "lost": r["lost"]}
    return out


SHORT = 10  # a short sentence has fewer source tokens than this


def mode_args(mode: str, express_tokens: int) -> list:
    """The server's batching flags of a mode: static, inflight, or express (in flight with an express lane)."""
    if mode == "express":
        return ["--batching", "inflight", "--express-tokens", express_tokens]
    return ["--batching", mode]


def mixed_mode(art: Path, mode: str, bodies: list[dict], clients: int, max_wait_ms: float,
               backend: str | None = None, express_tokens: int = SHORT - 1) -> dict:
    """One server batching as `mode` says: its short sentences alone (one client), then every body from
    `clients` closed-loop clients."""
    short = [b for b in bodies if len(b["ids"][0]) < SHORT]
    with Server(art, *mode_args(mode, express_tokens), "--max-queue", 4096, "--max-batch-rows", 64,
                "--max-wait-ms", max_wait_ms, *(["--backend", backend] if backend else [])) as server:
        asyncio.run(closed_loop(server.url, mixed(16, seed=99), 4))  # warm up
        alone = asyncio.run(closed_loop(server.url, short, 1))
        s0 = server.steps()
        r = asyncio.run(closed_loop(server.url, bodies, clients))
        s1 = server.steps()
    if r["ok"] != len(bodies):
        raise RuntimeError(f"{mode}: {r['ok']} of {len(bodies)} requests answered ({r})")
    unloaded = float(np.median([lat for lat, _ in alone["latencies"]])) * 1000
    loaded = float(np.median([lat for lat, b in r["latencies"] if len(b["ids"][0]) < SHORT])) * 1000
    return {"short_unloaded_p50_ms": unloaded, "short_loaded_p50_ms": loaded, "short_ratio": loaded / unloaded,
            "short_n": len(short), "all_p50_ms": float(np.median([lat for lat, _ in r["latencies"]])) * 1000,
            "requests_per_s": r["ok"] / r["wall"], "tokens_per_s": r["tokens"] / r["wall"],
            "rows_per_step": (s1[1] - s0[1]) / max(s1[0] - s0[0], 1), "steps": s1[0] - s0[0]}


def mixed_scenario(art: Path, n: int, rounds: int, clients: int, max_wait_ms: float, preset: str,
                   backend: str | None = None, modes: tuple[str, ...] = ("static", "inflight"),
                   express_tokens: int = SHORT - 1) -> dict:
    """The batching modes side by side: `rounds` runs of each on the same workload, the order reversed every
    other round; per mode the median of each number over its rounds."""
    bodies = mixed(n, seed=5)
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    for i in range(rounds):
        for mode in (modes if i % 2 == 0 else modes[::-1]):
            runs[mode].append(mixed_mode(art, mode, bodies, clients, max_wait_ms, backend, express_tokens))
            console.print(f"{preset} mixed {mode} round {i + 1}: {runs[mode][-1]}")
    out = {mode: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for mode, rs in runs.items()}
    out["clients"], out["requests"], out["rounds"], out["express_tokens"] = clients, n, rounds, express_tokens
    for mode in modes:
        out[mode]["throughput_ratio"] = out[mode]["tokens_per_s"] / out["static"]["tokens_per_s"]
    return out


MODES = {"static": "static", "inflight": "in flight", "express": "in flight + express lane (<= {express_tokens})"}


def mixed_markdown(report: dict) -> str:
    lines = []
    for preset, r in report.items():
        if preset == "machine":
            continue
        m = r["mixed_scenario"]
        lines += [f"#### {preset}: {m['requests']:.0f} requests, {m['clients']:.0f} clients, median of "
                  f"{m['rounds']:.0f} rounds", "",
                  "| batching | short p50 alone ms | short p50 loaded ms | ratio | requests/s | tokens/s | "
                  "rows per step | all p50 ms |", "|---|---|---|---|---|---|---|---|"]
        names = {mode: label.format(**m) for mode, label in MODES.items() if mode in m}
        for mode, name in names.items():
            x = m[mode]
            lines.append(f"| {name} | {x['short_unloaded_p50_ms']:.1f} | {x['short_loaded_p50_ms']:.1f} | "
                         f"{x['short_ratio']:.2f} | {x['requests_per_s']:.1f} | {x['tokens_per_s']:.0f} | "
                         f"{x['rows_per_step']:.1f} | {x['all_p50_ms']:.0f} |")
        throughput = ", ".join(f"{name} {m[mode]['throughput_ratio']:.2f}x" for mode, name in names.items()
                               if mode != "static")
        latency = ", ".join(f"{name} {m[mode]['short_ratio']:.2f}x" for mode, name in names.items())
        lines += ["", f"Throughput / static: {throughput}. Short sentences (n={m['static']['short_n']:.0f}) "
                      f"loaded / alone: {latency}.", ""]
    return "\n".join(lines)


async def timed(session: aiohttp.ClientSession, body: dict) -> tuple[float, float]:
    """One request's (seconds to its first streamed delta, seconds to its end): both the same unstreamed."""
    t0 = time.perf_counter()
    first = None
    async with session.post("/v1/translate", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{r.status}: {await r.text()}")
        if not body.get("stream"):
            await r.read()
        else:
            async for line in r.content:
                if first is None and line.startswith(b"event: delta"):
                    first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    return (total if first is None else first), total


async def clients_loop(url: str, bodies: list[dict], clients: int) -> tuple[list[tuple[float, float]], float]:
    """`clients` closed-loop workers over `bodies`: each request's (first, total) seconds, and the wall time."""
    queue, out = list(reversed(bodies)), []
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=clients), timeout=timeout) as session:
        async def worker():
            while queue:
                out.append(await timed(session, queue.pop()))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return out, time.perf_counter() - started


async def document_ways(url: str, sentences: list[str], repeats: int) -> dict:
    """Wall seconds of each way to translate `sentences` (median of `repeats`): one document request, one request
    a sentence all at once, one request a sentence one after another."""
    document = " ".join(sentences)
    ways: dict[str, list[float]] = {"one document request": [], "a request a sentence, all at once": [],
                                    "a request a sentence, one after another": []}
    async with aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=300)) as session:
        async def ask(texts, split=True):
            async with session.post("/v1/translate", json={"text": texts, "split": split}) as r:
                assert r.status == 200, await r.text()
                return await r.json()

        for _ in range(repeats):
            t0 = time.perf_counter()
            got = await ask([document])
            assert len(got["translations"][0][0]["sentences"]) == len(sentences), "the server split it otherwise"
            t1 = time.perf_counter()
            await asyncio.gather(*(ask([s], False) for s in sentences))
            t2 = time.perf_counter()
            for s in sentences:
                await ask([s], False)
            t3 = time.perf_counter()
            for way, seconds in zip(ways, (t1 - t0, t2 - t1, t3 - t2)):
                ways[way].append(seconds)
    return {way: float(np.median(seconds)) for way, seconds in ways.items()}


def clients_scenario(art: Path, clients: int, n: int, stream_tokens: int, document_sentences: int, repeats: int,
                     max_wait_ms: float) -> dict:
    from twostep.model.tasks import get_task

    sources = [s for s, _ in get_task("numbers-en-de").split("test")]
    body = {"max_new_tokens": stream_tokens, "suppress_eos": True, "split": False}
    report: dict = {"clients": clients, "requests": n, "tokens": stream_tokens}
    with Server(art, "--max-queue", 4096, "--max-batch-rows", 64, "--max-wait-ms", max_wait_ms) as server:
        asyncio.run(clients_loop(server.url, [{"text": [s], **body} for s in sources[:8]], 4))  # warm up
        for label, stream in (("whole answer", False), ("streamed", True)):
            bodies = [{"text": [sources[i % len(sources)]], **body, "stream": stream} for i in range(n)]
            times, wall = asyncio.run(clients_loop(server.url, bodies, clients))
            first, total = (np.array(x) * 1000 for x in zip(*times))
            report[label] = {"first_p50_ms": float(np.percentile(first, 50)),
                             "first_p95_ms": float(np.percentile(first, 95)),
                             "total_p50_ms": float(np.percentile(total, 50)),
                             "total_p95_ms": float(np.percentile(total, 95)), "requests_per_s": n / wall}
            console.print(f"{label}: {report[label]}")
        sentences = [s.rstrip(".") + "." for s in sources[:document_sentences]]
        report["document"] = asyncio.run(document_ways(server.url, sentences, repeats))
        console.print(f"document: {report['document']}")
    return report


def clients_markdown(report: dict) -> str:
    r = report["clients_scenario"]
    lines = [f"{r['clients']} closed-loop clients, {r['requests']} requests of one sentence decoding {r['tokens']} "
             f"tokens each ({report['machine']}):", "",
             "| answer | first text p50 ms | p95 | whole answer p50 ms | p95 | requests/s |",
             "|---|---|---|---|---|---|"]
    for label in ("whole answer", "streamed"):
        x = r[label]
        lines.append(f"| {label} | {x['first_p50_ms']:.0f} | {x['first_p95_ms']:.0f} | {x['total_p50_ms']:.0f} | "
                     f"{x['total_p95_ms']:.0f} | {x['requests_per_s']:.1f} |")
    one = r["document"]["one document request"]
    lines += ["", "| a document of sentences, on an idle server | median ms | vs one document request |",
              "|---|---|---|"]
    lines += [f"| {way} | {seconds * 1000:.0f} | {seconds / one:.2f}x |" for way, seconds in r["document"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/twostep-serve-load"))
    parser.add_argument("--presets", default="demo,base")
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--requests", type=int, default=96, help="Requests per concurrency level (at least 2 x it).")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="The server's --max-wait-ms.")
    parser.add_argument("--skip-baselines", action="store_true", help="Only the server (no offline bench, no API).")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--scenario", choices=("all", "mixed", "clients"), default="all",
                        help="mixed: only static vs in-flight batching on mixed lengths; clients: streams and "
                        "documents (the demo model).")
    parser.add_argument("--clients", type=int, default=32, help="--scenario clients: closed-loop clients.")
    parser.add_argument("--stream-tokens", type=int, default=48, help="--scenario clients: tokens each decodes.")
    parser.add_argument("--document-sentences", type=int, default=20, help="--scenario clients: a document's.")
    parser.add_argument("--repeats", type=int, default=10, help="--scenario clients: document timings' runs.")
    parser.add_argument("--mixed-requests", type=int, default=256, help="--scenario mixed: requests per run.")
    parser.add_argument("--rounds", type=int, default=2, help="--scenario mixed: runs of each mode, alternating.")
    parser.add_argument("--backend", help="--scenario mixed: the server's --backend (default ort-cpu), e.g. ort-cuda.")
    parser.add_argument("--modes", default="static,inflight,express", help="--scenario mixed: the batching modes "
                        "compared (static first): static, inflight, express (in flight with an express lane).")
    parser.add_argument("--express-tokens", type=int, default=SHORT - 1, help="--scenario mixed, mode express: "
                        "the server's --express-tokens (default: the short sentences', 9).")
    parser.add_argument("--decoders", default="plain", help="--scenario mixed: plain, inplace (the in-place "
                        "GroupQueryAttention variant, `export --inplace-cache`) or both: plain,inplace.")
    parser.add_argument("--threads", type=int, default=2, help="The server's --threads (intra-op threads).")
    args = parser.parse_args()
    Server.threads = args.threads
    args.work.mkdir(parents=True, exist_ok=True)
    levels = [int(x) for x in args.concurrency.split(",")]
    report = {"machine": f"{platform.processor() or platform.machine()}, {platform.python_version()}"}
    if args.scenario == "clients":
        report["clients_scenario"] = clients_scenario(prepare(args.work, "demo"), args.clients, args.requests,
                                                      args.stream_tokens, args.document_sentences, args.repeats,
                                                      args.max_wait_ms)
        print(json.dumps(report, indent=1))
        if args.markdown:
            args.markdown.write_text(clients_markdown(report))
        console.print(clients_markdown(report))
        return
    if args.scenario == "mixed":
        if args.modes.split(",")[0] != "static" or not set(args.modes.split(",")) <= set(MODES):
            parser.error(f"--modes: static first, then any of {', '.join(MODES)}; got {args.modes}")
        for preset in args.presets.split(","):
            for decoder in args.decoders.split(","):
                art = prepare(args.work, preset, inplace=decoder == "inplace")
                name = preset if decoder == "plain" else f"{preset}, in-place decoder"
                report[name] = {"mixed_scenario": mixed_scenario(art, args.mixed_requests, args.rounds, 32,
                                                                  args.max_wait_ms, name, args.backend,
                                                                  tuple(args.modes.split(",")), args.express_tokens)}
        print(json.dumps(report, indent=1))
        if args.markdown:
            args.markdown.write_text(mixed_markdown(report))
        console.print(mixed_markdown(report))
        return
    for preset in args.presets.split(","):
        art = prepare(args.work, preset)
        offline = offline_bench(art) if preset == "base" and not args.skip_baselines else None
        single = None if args.skip_baselines else one_at_a_time(art, workload(preset, art, 24 if preset == "base"
                                                                             else 96, seed=3))
        report[preset] = {"offline_batch32_tokens_per_s": offline, "one_at_a_time": single,
                          **run_server_levels(preset, art, levels, args.requests, args.max_wait_ms)}
    print(json.dumps(report, indent=1))
    if args.markdown:
        args.markdown.write_text(markdown(report))
    table = Table(title="twostep serve, closed loop")
    for col in ("preset", "clients", "req/s", "tokens/s", "p50 ms", "p95 ms", "p99 ms", "mean batch"):
        table.add_column(col)
    for preset in args.presets.split(","):
        for clients, r in report[preset]["levels"].items():
            table.add_row(preset, str(clients), f"{r['requests_per_s']:.1f}", f"{r['tokens_per_s']:.0f}",
                          f"{r['p50_ms']:.0f}", f"{r['p95_ms']:.0f}", f"{r['p99_ms']:.0f}", f"{r['mean_batch']:.1f}")
    console.print(table)


def markdown(report: dict) -> str:
    lines = []
    for preset, r in report.items():
        if preset == "machine":
            continue
        single = r["one_at_a_time"]
        lines += [f"#### {preset}", "", "| clients | requests/s | tokens/s | p50 ms | p95 ms | p99 ms | mean batch |",
                  "|---|---|---|---|---|---|---|"]
        if single:
            lines.append(f"| Python API, one at a time | {single['requests_per_s']:.1f} | "
                         f"{single['tokens_per_s']:.0f} | "
                         f"{single['p50_ms']:.0f} | {single['p95_ms']:.0f} | {single['p99_ms']:.0f} | 1 |")
        for clients, x in r["levels"].items():
            lines.append(f"| {clients} | {x['requests_per_s']:.1f} | {x['tokens_per_s']:.0f} | {x['p50_ms']:.0f} | "
                         f"{x['p95_ms']:.0f} | {x['p99_ms']:.0f} | {x['mean_batch']:.1f} |")
        if r["offline_batch32_tokens_per_s"] and single:
            c32 = r["levels"].get(32)
            lines += ["", f"Offline `twostep bench` batch 32: {r['offline_batch32_tokens_per_s']:.0f} tokens/s"
                      + (f"; the server at 32 clients reaches "
                         f"{c32['tokens_per_s'] / r['offline_batch32_tokens_per_s']:.0%} of it and "
                         f"{c32['tokens_per_s'] / single['tokens_per_s']:.1f}x one-at-a-time." if c32 else ".")]
        lines += ["", "| mixed lengths 5-60 | p50 ms | p95 ms | n |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['p50_ms']:.0f} | {v['p95_ms']:.0f} | {v['n']} |" for k, v in r["mixed"].items()]
        o = r["overload"]
        lines += ["", f"Overload: {o['clients']} clients, queue {o['queue']}: {o['sent']} sent, {o['ok']} answered, "
                      f"{o['refused_503']} refused with 503, {o['errors']} errors, {o['lost']} lost.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
