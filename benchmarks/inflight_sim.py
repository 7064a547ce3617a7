"""The decoding loop alone under the mixed-length closed loop: static vs in-flight batching without HTTP.

    python -m benchmarks.inflight_sim ART [ART ...] [--requests 256] [--slots 32] [--threads 2]
                                      [--between-runs stop,spin] [--rounds 2]

The workload of `serve_load --scenario mixed` (the same 256 sources of 5-60 tokens, each decoding 2 x its
length + 16 tokens, eos suppressed) through one `RunningBatch` on one ort-cpu session, `--slots` sentences
at a time, as `--slots` closed-loop clients would keep it: static batching starts a batch of the next
`--slots` sentences once the last one is done; in-flight batching fills every slot a finished sentence left
at the next step. No server, no clients, no queue: what it measures is the decoding itself. Per artifact,
mode and what ONNX Runtime's pool threads do after a run (`stop`: they stop spinning, the library's default;
`spin`: they spin on, waiting for the next, ONNX Runtime's default: `OrtBackend.spin_between_runs`), the
median of `--rounds` runs: wall time, generated tokens/s, decoder steps, rows a step, and the
self-attention cache's mean width (the oldest row's history; the in-place decoder's capacity instead).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.serve_load import mixed
from twostep.artifact import load_artifact
from twostep.runtime.backends.ort import OrtBackend
from twostep.runtime.decoding import DecodeOptions, Entry, RunningBatch
from twostep.runtime.translator import Limits, Translator


def run(session, limits: Limits, sources: list[list[int]], slots: int, inflight: bool) -> dict:
    options = DecodeOptions(suppress_eos=True)
    limit = Translator(session, limits).max_new_tokens  # each sentence's own: 2 x its length + 16, capped
    batch = RunningBatch(session, specials=limits.specials)
    queue, steps, rows, widths, tokens = list(sources), 0, 0, 0, 0
    started = time.perf_counter()
    while queue or batch.sentences:
        if queue and (inflight or not batch.sentences):
            n = min(slots - batch.sentences, len(queue))
            batch.add([Entry(s, options, limit([s]), None) for s in queue[:n]])
            queue = queue[n:]
        steps, rows = steps + 1, rows + batch.live_rows
        widths += getattr(session, "capacity", None) or session.rows.past_len
        tokens += sum(len(hyps[0].tokens) for _, hyps in batch.step())
    wall = time.perf_counter() - started
    return {"wall_s": wall, "tokens_per_s": tokens / wall, "steps": steps, "rows_per_step": rows / steps,
            "mean_width": widths / steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifacts", nargs="+", type=Path)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--between-runs", default="stop,spin", help="stop, spin or both: stop,spin.")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    sources = [body["ids"][0] for body in mixed(args.requests, seed=5)]
    print("| artifact | decoder | between runs | batching | wall s | tokens/s | steps | rows a step | cache width |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in args.artifacts:
        artifact = load_artifact(path)
        limits = Limits.of(artifact.config, artifact.config.max_positions)
        for after in args.between_runs.split(","):
            backend_class = type("Backend", (OrtBackend,), {"spin_between_runs": after == "spin"})
            with backend_class(artifact, threads=args.threads) as backend:
                session = backend.session()
                run(session, limits, sources[:16], args.slots, True)  # warm up
                results = {"static": [], "inflight": []}
                for i in range(args.rounds):
                    for mode in ("static", "inflight") if i % 2 == 0 else ("inflight", "static"):
                        results[mode].append(run(session, limits, sources, args.slots, mode == "inflight"))
                for mode, runs in results.items():
                    m = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
                    print(f"| {path.name} | {'in-place' if backend.inplace else 'plain'} | {after} | {mode} | "
                          f"{m['wall_s']:.2f} | {m['tokens_per_s']:.0f} | {m['steps']:.0f} | "
                          f"{m['rows_per_step']:.1f} | {m['mean_width']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
