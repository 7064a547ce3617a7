"""Where a request's time goes in `twostep serve`, from the client's socket to its answer.

    python -m benchmarks.request_path ART [ART ...] [--requests 200] [--clients 1] [--source en --target fr]
                                      [--text "..."] [--threads 2] [--json OUT] [--markdown OUT]

The server is `twostep serve ART ...` in a child process whose request path is timed (wrappers around the
functions below, nothing else changed): each stage's calls, their median and mean, and their total per request
beside the client's latency. `--clients` closed-loop clients (httpx, one connection each) send LibreTranslate's
POST /translate (JSON: q, source, target) of `--text` (by default three short sentences in turn), one stage
after another:

- http: everything inside the ASGI app (FastAPI's middleware, routing, the endpoint, the JSON answer);
- translate: Service.translate, the endpoint's decode (below); the rest of http is parsing and formatting;
- encode: the texts split into sentences and tokenized; submit: the sentences queued;
- wait: until_disconnected, from the queue to the last sentence's answer (the batch's wait, its encoder, its
  steps); of it the worker's join (the encoder run for the sentences that join, their rows added) and steps
  (each a decoder run and the search), counted per batch: per request at 1 client, shared among requests above;
- unknowns: replace_unknowns (CTranslate2's, as Argos packages decode: an alignment run where a hypothesis holds
  <unk>).

The client's latency less http is the socket, uvicorn's parsing and the client itself. The machine is shared with
whatever else runs on it: the load average is printed.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import inspect
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

TEXTS = ["The cat sat in the park.", "A quick fox jumps over the lazy dog.", "We ran all day over the mat."]
STAGES = ("http", "translate", "encode", "submit", "wait", "join", "step", "unknowns")


def timed_server(argv: list[str], out: Path) -> None:
    """`twostep serve ARGV` with the request path's functions timed; each stage's durations (seconds) written
    to `out` as JSON when it is stopped (SIGTERM), forgotten on SIGUSR1."""
    from twostep.serving import engine, executor, middleware, service

    durations: dict[str, list[float]] = defaultdict(list)

    def wrap(owner, name: str, stage: str) -> None:
        fn = getattr(owner, name)
        if inspect.iscoroutinefunction(fn):
            async def timed(*args, **kwargs):
                if stage == "http" and args[1]["type"] != "http":  # the app's lifespan: not a request
                    return await fn(*args, **kwargs)
                started = time.perf_counter()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    durations[stage].append(time.perf_counter() - started)
        else:
            def timed(*args, **kwargs):
                started = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    durations[stage].append(time.perf_counter() - started)
        setattr(owner, name, functools.wraps(fn)(timed))

    wrap(middleware.RequestLog, "__call__", "http")
    wrap(service.Service, "translate", "translate")
    wrap(service.Service, "encode", "encode")
    wrap(service.Service, "submit", "submit")
    wrap(service, "until_disconnected", "wait")
    wrap(engine.BatchingEngine, "join", "join")
    wrap(engine.BatchingEngine, "step", "step")
    wrap(executor.BatchingTranslator, "replace_unknowns", "unknowns")

    atexit.register(lambda: out.write_text(json.dumps(durations)))  # uvicorn stops on SIGTERM, then this
    signal.signal(signal.SIGUSR1, lambda *_: durations.clear())  # the warm-up is over
    from twostep.cli import main

    sys.argv = ["twostep", "serve", *argv]
    main()


def run_clients(url: str, clients: int, requests: int, body) -> tuple[list[float], float]:
    """`clients` threads, each with its own connection, sending until `requests` were sent: each answer's
    latency (seconds) and the wall time."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    sent, latencies = iter(range(requests)), []

    def client() -> None:
        with httpx.Client(timeout=120) as http:
            for i in sent:
                started = time.perf_counter()
                r = http.post(f"{url}/translate", json=body(i))
                if r.status_code != 200:
                    raise RuntimeError(f"{r.status_code}: {r.text[:300]}")
                latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(client) for _ in range(clients)]:
            f.result()
    return latencies, time.perf_counter() - started


def summarize(durations: dict[str, list[float]], latencies: list[float], wall_s: float, requests: int) -> dict:
    ms = lambda values: 1000 * statistics.median(values) if values else 0.0  # noqa: E731
    stages = {stage: {"calls": len(durations.get(stage, [])), "p50_ms": ms(durations.get(stage, [])),
                      "per_request_ms": 1000 * sum(durations.get(stage, [])) / requests} for stage in STAGES}
    return {"requests": requests, "requests_per_s": requests / wall_s, "client_p50_ms": ms(latencies),
            "client_mean_ms": 1000 * statistics.mean(latencies), "stages": stages}


def report(meta: dict, result: dict) -> str:
    lines = [f"CPU: {meta['cpu']}, {meta['cores']} cores; {meta['date']}; load average before/after "
             f"{meta['load_average'][0]}/{meta['load_average'][1]}; {meta['clients']} client(s), "
             f"{result['requests']} requests of POST /translate; models: {', '.join(meta['models'])}; threads "
             f"{meta['threads']}",
             "", f"Client: p50 {result['client_p50_ms']:.2f} ms, mean {result['client_mean_ms']:.2f} ms, "
             f"{result['requests_per_s']:.1f} requests/s.", "",
             "| stage | calls | p50 ms a call | ms a request (total / requests) |", "|---|---:|---:|---:|"]
    for stage, row in result["stages"].items():
        lines.append(f"| {stage} | {row['calls']} | {row['p50_ms']:.2f} | {row['per_request_ms']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", type=Path, help="artifact folders, served as `twostep serve` would")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--source", default="en")
    p.add_argument("--target", default="fr")
    p.add_argument("--text", action="append", help="a text to send (repeat; default: three short sentences)")
    p.add_argument("--threads", type=int, default=2, help="each model's intra-op threads (twostep serve --threads)")
    p.add_argument("--warmup", type=int, default=20, help="requests sent first, not counted")
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    p.add_argument("--timed-server", type=Path, help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    if args.timed_server:
        timed_server([str(m) for m in args.models] + rest, args.timed_server)
        return 0
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")

    import tempfile

    import httpx

    from benchmarks.libretranslate import cpu_info, free_port, load_average

    texts = args.text or TEXTS
    body = lambda i: {"q": texts[i % len(texts)], "source": args.source, "target": args.target}  # noqa: E731
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "durations.json"
        cmd = [sys.executable, "-m", "benchmarks.request_path", *map(str, args.models), "--timed-server", str(out),
               "--port", str(port), "--threads", str(args.threads)]
        log = open(Path(tmp) / "server.log", "w")
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[1])
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"the server exited: {(Path(tmp) / 'server.log').read_text()[-2000:]}")
                try:
                    if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the server was not ready within 120 s")
                time.sleep(0.2)
            before = load_average()
            run_clients(url, 1, args.warmup, body)
            server.send_signal(signal.SIGUSR1)  # forget the warm-up's durations
            time.sleep(0.5)
            latencies, wall = run_clients(url, args.clients, args.requests, body)
        finally:
            server.terminate()
            server.wait(30)
            log.close()
        durations = json.loads(out.read_text())
    result = summarize(durations, latencies, wall, args.requests)
    cpu, _ = cpu_info()
    meta = {"cpu": cpu, "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M"), "clients": args.clients,
            "threads": args.threads, "models": [str(m) for m in args.models],
            "load_average": [before, load_average()], "command": "python -m benchmarks.request_path " +
            " ".join(argv if argv is not None else sys.argv[1:])}
    table = report(meta, result)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, **result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
