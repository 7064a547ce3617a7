"""The memory and time it takes to open an artifact and translate with it: `twostep translate` (open, one
sentence, exit) and `twostep serve` (start to /readyz, then one request answered), each in a fresh process tree
sampled by benchmarks/memory.py, its peak PSS against the artifact's bytes.

    python -m benchmarks.load_memory ARTIFACT [--sentence TEXT] [--new-tokens 8] [--option KEY=VALUE ...]
                                     [--json OUT] [--markdown OUT]

ONNX Runtime memory-maps an artifact's external data (`weights.data`) and twostep opens its sessions with
prepacking off where that would copy the weights (docs/artifact.md), so the peak is about the artifact's bytes
plus Python, torch-free imports and the sessions' working memory. `--option` adds a decoding option or a
language to both (`tgt_lang=fr`: `--tgt-lang fr` and `"tgt_lang": "fr"`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

from benchmarks.export_time import output_bytes
from benchmarks.many_models import free_port
from benchmarks.marian import cpu_model, twostep_cli
from benchmarks.memory import GIB, Peak, measure


def serve(artifact: Path, body: dict, timeout: float = 1800) -> tuple[Peak, float, dict]:
    """`twostep serve ARTIFACT` on a free loopback port, sampled from its start until it is stopped after
    answering `body` once: (its peak, seconds to /readyz 200, the answer)."""
    base = f"http://127.0.0.1:{free_port()}"
    found: dict = {}

    def client(process: subprocess.Popen) -> None:
        """Waits for /readyz, sends `body` once, then stops the server."""
        started = time.perf_counter()
        try:
            while process.poll() is None and time.perf_counter() - started < timeout:
                try:
                    if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            found["ready_s"] = time.perf_counter() - started
            found["answer"] = httpx.post(f"{base}/v1/translate", json=body, timeout=timeout).json()
        finally:
            process.terminate()

    command = twostep_cli("serve", artifact, "--port", base.rsplit(":", 1)[1])
    peak = measure(command, interval=0.2, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout,
                   started=client)
    if "answer" not in found:
        raise RuntimeError(f"twostep serve {artifact} did not answer (exit {peak.returncode})")
    return peak, found["ready_s"], found["answer"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact", type=Path)
    p.add_argument("--sentence", default="A sentence to translate.")
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--option", action="append", default=[], help="KEY=VALUE, given to translate and serve")
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)
    options = dict(o.split("=", 1) for o in args.option)
    size = output_bytes(args.artifact)
    flags = [a for k, v in options.items() for a in (f"--{k.replace('_', '-')}", v)]
    translate = measure(twostep_cli("translate", args.artifact, args.sentence, "--max-new-tokens", args.new_tokens,
                                    *flags), interval=0.2, stdout=subprocess.DEVNULL)
    if translate.returncode != 0:
        raise SystemExit(f"twostep translate {args.artifact} failed (exit {translate.returncode})")
    served, ready, answer = serve(args.artifact, {"text": [args.sentence], "max_new_tokens": args.new_tokens,
                                                  **options})
    rows = {"twostep translate (open + one sentence)": {"pss": translate.pss, "seconds": translate.seconds},
            "twostep serve (start to ready + one request)": {"pss": served.pss, "seconds": served.seconds,
                                                             "ready_seconds": ready}}
    result = {"artifact": str(args.artifact), "artifact_bytes": size, "cpu": cpu_model(),
              "date": time.strftime("%Y-%m-%d"), "rows": rows, "answer": answer}
    lines = [f"{args.artifact}: {size:,} bytes. CPU {result['cpu']}, {result['date']}.", "",
             "| command | peak PSS GiB | / artifact bytes | s | ready after s |", "|---|---:|---:|---:|---:|"]
    for name, row in rows.items():
        ready_s = f"{row['ready_seconds']:.1f}" if "ready_seconds" in row else ""
        lines.append(f"| {name} | {row['pss'] / GIB:.2f} | {row['pss'] / size:.2f} | {row['seconds']:.1f} | "
                     f"{ready_s} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
