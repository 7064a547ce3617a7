"""What one decoder step costs as rows and cache width grow: the floor under any batching scheduler.

    python -m benchmarks.step_rows ARTIFACT [ARTIFACT ...] [--iters 50]

Runs the artifact's plain decoder graph (ort-cpu, 2 threads) on zero inputs: `rows` rows whose self cache is
`width` columns wide (every row's history that long, capped below max_positions), cross K/V of 40 source
tokens; prints the median of `--iters` runs per shape. A short sentence that decodes beside 28 others pays the
29-row step at each of its steps, so the ratio of the two columns bounds its latency under load.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from twostep.artifact import load_artifact
from twostep.runtime.backends.ort import OrtBackend

SHAPES = [(1, 30), (17, 70), (29, 70), (29, 136)]


def step_ms(backend: OrtBackend, rows: int, width: int, iters: int) -> float:
    decoder, config = backend.graphs["decoder"], backend.config
    feeds = {"input_ids": np.full((rows, 1), 4, np.int64), "encoder_attention_mask": np.ones((rows, 40), np.int64),
             "past_lengths": np.full(rows, min(width, config.max_positions - 1), np.int64)}
    for t in decoder.past_self:
        feeds[t.name] = np.zeros(t.concrete(batch=rows, past_len=width), np.float32)
    for t in decoder.past_cross:
        feeds[t.name] = np.zeros(t.concrete(batch=rows, src_len=40), np.float32)
    backend.run("decoder", feeds)
    times = []
    for _ in range(iters):
        started = time.perf_counter()
        backend.run("decoder", feeds)
        times.append(time.perf_counter() - started)
    return 1000 * float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifacts", nargs="+", type=Path)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    print("| artifact | " + " | ".join(f"{r} rows, width {w}" for r, w in SHAPES) + " |")
    print("|---|" + "---|" * len(SHAPES))
    for path in args.artifacts:
        with OrtBackend(load_artifact(path), threads=2, kv_cache="concat") as backend:
            cells = [f"{step_ms(backend, r, w, args.iters):.2f} ms" for r, w in SHAPES]
        print(f"| {path.name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
