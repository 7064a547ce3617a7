"""Decode speed of the C++ example against the Python runtime (`twostep bench --backend ort-cpu`), side by side.

    .venv/bin/python cpp/bench.py ART_DIR [--batch 1,32] [--new-tokens 64] [--threads 2] [--exe cpp/build/twostep-translate]

Both decode the same random sources (twostep.bench.make_sources: src_len ids ending with eos) with EOS suppressed,
for exactly --new-tokens tokens; each measures the median whole-request time over --iters runs after --warmup runs,
in its own process (Python: `twostep bench`'s own code). The two alternate for --rounds rounds, so that a noisy
machine slows both alike; the table shows the median over rounds. The C++ outputs are also checked against the
Python runtime's token ids.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from twostep.bench import Workload, bench, make_sources
from twostep.runtime.decoding import DecodeOptions
from twostep.runtime.translator import open_translator

ROOT = Path(__file__).resolve().parent


def cpp_request_ms(exe: Path, art: Path, sources: list[list[int]], w: Workload, threads: int, warmup: int,
                   iters: int) -> tuple[float, list[list[int]]]:
    proc = subprocess.run(
        [str(exe), str(art), "--ids", "--suppress-eos", "--max-new-tokens", str(w.new_tokens), "--beam", str(w.beam),
         "--threads", str(threads), "--batch-size", str(len(sources)), "--warmup", str(warmup), "--repeat", str(iters)],
        input="".join(" ".join(map(str, s)) + "\n" for s in sources), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{exe} failed: {proc.stderr.strip()}")
    runs = [float(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("run_ms ")]
    outputs = [[int(t) for t in line.split()] for line in proc.stdout.splitlines()]
    return statistics.median(runs), outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("art", type=Path)
    parser.add_argument("--batch", default="1,32")
    parser.add_argument("--src-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--exe", type=Path, default=ROOT / "build" / "twostep-translate")
    args = parser.parse_args()
    if not args.exe.is_file():
        sys.exit(f"{args.exe}: not built; run cpp/fetch_deps.sh and cmake -S cpp -B cpp/build && make -C cpp/build")

    workloads = [Workload(int(b), args.src_len, args.new_tokens, args.beam) for b in args.batch.split(",")]
    rows = []
    for w in workloads:
        translator, backend = open_translator(args.art, "ort-cpu", threads=args.threads, options=DecodeOptions(
            beam_size=w.beam, max_new_tokens=w.new_tokens, suppress_eos=True))
        with backend:
            sources = make_sources(backend.config.src_vocab_size, backend.config.eos_id, w.batch, w.src_len)
            expected = translator.translate_ids(sources)
        py_ms, cpp_ms = [], []
        for _ in range(args.rounds):
            (py,) = bench(["ort-cpu"], args.art, None, [w], args.warmup, args.iters, args.threads)
            if py.error:
                sys.exit(f"python ort-cpu: {py.error}")
            py_ms.append(py.latency_ms["p50"])
            ms, outputs = cpp_request_ms(args.exe, args.art, sources, w, args.threads, args.warmup, args.iters)
            cpp_ms.append(ms)
            print(f"{w.label}: python {py_ms[-1]:.1f} ms, c++ {ms:.1f} ms", file=sys.stderr)
        same = sum(a == b for a, b in zip(outputs, expected))
        py_med, cpp_med = statistics.median(py_ms), statistics.median(cpp_ms)
        tokens = w.batch * w.new_tokens
        rows.append((w, py_med, tokens / py_med * 1000, cpp_med, tokens / cpp_med * 1000, f"{same}/{len(expected)}"))

    print(f"{'workload':<32} {'python ms':>10} {'python tok/s':>13} {'c++ ms':>10} {'c++ tok/s':>10} "
          f"{'c++/python':>10} {'same ids':>9}")
    for w, py_ms, py_tps, cpp_ms, cpp_tps, same in rows:
        print(f"{w.label:<32} {py_ms:>10.1f} {py_tps:>13.1f} {cpp_ms:>10.1f} {cpp_tps:>10.1f} "
              f"{cpp_tps / py_tps:>9.2f}x {same:>9}")


if __name__ == "__main__":
    main()
