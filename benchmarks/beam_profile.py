"""Where a beam-search (or, with --beam 1, greedy) request's time goes: the decoder steps inside ONNX Runtime,
the cache reorders, and the host loop (candidate selection, bookkeeping, the encoder), then ONNX Runtime's own
per-op profile.

    python -m benchmarks.beam_profile ARTIFACT [--kv-cache auto|inplace|concat] [--loop vectorised|reference]
                                      [--search graph|logits] [--batch 32] [--beam 4] [--new-tokens 64]
                                      [--threads 2] [--ops 8]
    python -m benchmarks.beam_profile ARTIFACT --attention [--rows 32,128] [--pasts 8,32,64] [--beam 4]

`--attention` times one decoder layer's self-attention over the cache as each operator that can write it in
place (benchmarks.attention: GroupQueryAttention, opset-24 TensorScatter + Attention, MultiHeadAttention,
DecoderMaskedMultiHeadAttention with cache indirection, two batched MatMuls), at the artifact's heads and head
size, with the beam reorder a layer costs without cache indirection, instead of the search.

`--search logits` searches on the full logits on the host, as twostep did before the decoder's search outputs
(`graph`, the default where the artifact has them). `--loop reference` runs the per-sentence beam loop twostep
had before it was vectorised (kept in tests/reference_beam.py as the oracle of the tests), on the logits.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from twostep.artifact import load_artifact
from twostep.bench import make_sources
from twostep.runtime import decoding
from twostep.runtime.backends.ort import OrtBackend
from twostep.runtime.decoding.search import Beam


class Timed:
    """A step session whose step and reorder calls are timed; `logits`: one that gives the full logits only."""

    def __init__(self, session, logits: bool = False):
        self.session, self.step_s, self.reorder_s = session, 0.0, 0.0
        self.steps: list[float] = []  # each decoder step's seconds, in order
        self.search_width = 0 if logits else session.search_width

    def search_step(self, ids, need_logits=True):
        started = time.perf_counter()
        out = self.session.search_step(ids, need_logits)
        self.steps.append(time.perf_counter() - started)
        self.step_s += self.steps[-1]
        return out

    def claimed(self):
        return self.session.claimed()

    def start(self, ids, mask):
        self.session.start(ids, mask)

    def admit(self, ids, mask, sources, rows):
        self.session.admit(ids, mask, sources, rows)

    def release(self, rows):
        self.session.release(rows)

    def step(self, ids):
        started = time.perf_counter()
        out = self.session.step(ids)
        self.steps.append(time.perf_counter() - started)
        self.step_s += self.steps[-1]
        return out

    def reorder(self, origin, cache_only=False):
        started = time.perf_counter()
        self.session.reorder(origin, cache_only)
        self.reorder_s += time.perf_counter() - started


def beam_loop(name: str, specials: decoding.Specials, beam: int, new_tokens: int):
    """The search to time, a function of (session, sources): beam search with eos suppressed."""
    if name == "vectorised":
        options = decoding.DecodeOptions(beam_size=beam, suppress_eos=True)
        return lambda session, sources: decoding.decode(session, sources, options, specials=specials,
                                                        max_new_tokens=new_tokens, group=Beam if beam > 1 else None)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from reference_beam import beam_search

    return lambda session, sources: beam_search(session, sources, beam_size=beam, bos_id=specials.bos_id,
                                                eos_id=specials.eos_id, pad_id=specials.pad_id,
                                                max_new_tokens=new_tokens, suppress_eos=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifact", type=Path)
    p.add_argument("--kv-cache", default="auto")
    p.add_argument("--loop", default="vectorised", choices=("vectorised", "reference"))
    p.add_argument("--search", default="graph", choices=("graph", "logits"),
                   help="the decoder's search outputs (where the artifact has them) or the full logits")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--src-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ops", type=int, default=8, help="profiled steps for the per-op table (0: none)")
    p.add_argument("--attention", action="store_true", help="time the self-attention variants instead")
    p.add_argument("--rows", default="32,128", help="--attention: the row counts (batch x beam)")
    p.add_argument("--pasts", default="8,32,64", help="--attention: the cached positions")
    p.add_argument("--iters", type=int, default=30, help="--attention: timed steps per cell (the median is shown)")
    args = p.parse_args(argv)
    artifact = load_artifact(args.artifact)
    if args.attention:
        from benchmarks import attention
        from twostep.runtime.backends.ortlib import import_ort

        c = artifact.config
        print(f"{args.artifact.name}: one decoder layer's self-attention, {c.n_heads} heads of {c.head_dim_k}, "
              f"{args.threads} threads, beam {args.beam}, µs per step (median of {args.iters})\n")
        print(attention.measure(import_ort(), c.n_heads, c.head_dim_k, ints(args.rows), ints(args.pasts), args.beam,
                                args.threads, args.iters))
        return 0
    search = beam_loop(args.loop, decoding.Specials.of(artifact.config), args.beam, args.new_tokens)
    with OrtBackend(artifact, threads=args.threads, kv_cache=args.kv_cache) as backend:
        c = backend.config
        sources = make_sources(c.src_vocab_size, c.eos_id, args.batch, args.src_len)
        logits = args.search == "logits" or args.loop == "reference"
        search(Timed(backend.session(), logits), sources)  # warm-up
        session = Timed(backend.session(), logits)
        started = time.perf_counter()
        search(session, sources)
        total = time.perf_counter() - started
        decoder = backend.decoder
    steps = args.new_tokens
    host = total - session.step_s - session.reorder_s
    where = "full logits" if logits or not session.search_width else "search outputs"
    print(f"{args.artifact.name}, {decoder}, {args.loop} loop on the {where}, batch {args.batch} beam {args.beam}, "
          f"{steps} tokens: "
          f"{total:.2f} s ({args.batch * steps / total:.0f} tokens/s) = decoder steps {session.step_s:.2f} s "
          f"({1000 * session.step_s / steps:.1f} ms/step) + reorders {session.reorder_s:.2f} s "
          f"({1000 * session.reorder_s / steps:.1f} ms/step) + host {host:.2f} s ({1000 * host / steps:.1f} ms/step, "
          "with the encoder)")
    if len(session.steps) >= 16:  # how a step's cost grows with the past: the first 8 steps against the last 8
        first, last = (1000 * statistics.median(session.steps[i]) for i in (slice(0, 8), slice(-8, None)))
        print(f"decoder step at past 0-7: {first:.1f} ms, at past {steps - 8}-{steps - 1}: {last:.1f} ms "
              f"({last / first:.2f}x)")
    if args.ops:
        print(op_profile(artifact, args, decoder))
    return 0


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def op_profile(artifact, args, decoder: str) -> str:
    """ONNX Runtime's profiler over `--ops` decoder steps at batch x beam rows, past up to --ops."""
    with tempfile.TemporaryDirectory() as tmp:
        class Profiled(OrtBackend):
            def session_options(self, graph=None):
                options = super().session_options(graph)
                options.enable_profiling, options.profile_file_prefix = True, f"{tmp}/ort"
                return options

        with Profiled(artifact, threads=args.threads, kv_cache=args.kv_cache) as backend:
            c = backend.config
            rows = args.batch * args.beam
            ids, mask = decoding.pad_batch(make_sources(c.src_vocab_size, c.eos_id, rows, args.src_len), c.pad_id)
            session = backend.session()
            session.start(ids, mask)
            for _ in range(args.ops):
                session.step(np.full((rows, 1), c.bos_id))
            events = json.loads(Path(backend.sessions[decoder].end_profiling()).read_text())
    per_op = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"]["op_name"]] += e["dur"]
    lines = [f"| {decoder} op ({rows} rows, {args.ops} steps) | µs per step |", "|---|---:|"]
    lines += [f"| {op} | {us / args.ops:,.0f} |" for op, us in per_op.most_common(12)]
    lines.append(f"| all kernels | {sum(per_op.values()) / args.ops:,.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
