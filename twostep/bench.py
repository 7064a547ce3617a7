"""`twostep bench`: every backend on the same inputs, with a fixed output length (EOS suppressed) so that
backends do equal work.

Each backend runs in its own child process, so that its load time and peak RSS are its own and one
backend's allocations do not slow the next; the parent shows progress and gathers the results.
"""

from __future__ import annotations

import multiprocessing
import queue
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Workload:
    batch: int
    src_len: int = 32
    new_tokens: int = 64
    beam: int = 1

    @property
    def label(self) -> str:
        beam = f" beam {self.beam}" if self.beam > 1 else ""
        return f"batch {self.batch}, src {self.src_len}, {self.new_tokens} new{beam}"


@dataclass
class Result:
    backend: str
    workload: Workload
    tokens_per_s: float = 0.0  # generated tokens (batch x new_tokens) per second of whole requests
    ms_per_step: float = 0.0  # (request - encoder) / new_tokens
    latency_ms: dict[str, float] = field(default_factory=dict)  # p50, p95, p99 of whole requests
    encoder_ms: float = 0.0
    load_s: float = 0.0
    peak_rss_mb: float = 0.0
    iters: int = 0
    error: str | None = None  # the backend could not run here, and why
    decoder: str | None = None  # the decoder graph the backend chose (decoder, decoder_inplace)

    def to_dict(self) -> dict:
        return {**asdict(self), "workload": asdict(self.workload)}


def make_sources(vocab: int, eos_id: int, batch: int, src_len: int, seed: int = 0) -> list[list[int]]:
    """The same random source sentences for every backend: src_len tokens each, the last one eos."""
    rng = np.random.default_rng(seed + 1000 * batch + src_len)
    return [rng.integers(4, vocab, src_len - 1).tolist() + [eos_id] for _ in range(batch)]


def peak_rss_mb() -> float:
    """This process's peak resident set. VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a
    spawned child would report its parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_bandwidth_gbs(threads: int = 2, megabytes: int = 256, repeats: int = 7) -> float:
    """Read bandwidth of this machine in GB/s: the median over `repeats` of `threads` threads summing their
    share of a float32 array far larger than the caches (numpy's reductions let go of the GIL). A decode
    step at batch 1 reads every decoder weight once, so weight bytes / this is its floor."""
    from concurrent.futures import ThreadPoolExecutor

    data = np.ones(megabytes * (1 << 20) // 4, dtype=np.float32)
    parts = np.array_split(data, threads)
    rates = []
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(np.sum, parts))  # pages touched, threads started
        for _ in range(repeats):
            started = time.perf_counter()
            list(pool.map(np.sum, parts))
            rates.append(data.nbytes / (time.perf_counter() - started) / 1e9)
    return float(np.median(rates))


def weight_bytes_per_step(graph_file: Path) -> int:
    """Bytes of the weights a decode step reads: every initializer that a node other than Gather consumes
    (an embedding lookup reads one row of its table, not the table)."""
    import onnx

    model = onnx.load(str(graph_file), load_external_data=False)
    sizes = {t.name: int(np.prod(t.dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
             for t in model.graph.initializer}
    read = {name for node in model.graph.node if node.op_type != "Gather" for name in node.input if name in sizes}
    return sum(sizes[name] for name in read)


def measure(name: str, w: Workload, request: Callable[[], None], encode: Callable[[], None] | None,
            warmup: int, iters: int, tick: Callable[[], None] = lambda: None, load_s: float = 0.0) -> Result:
    """Median whole-request time over `iters` after `warmup`; `encode` alone is timed to split off the encoder."""
    for _ in range(warmup):
        request()
        tick()
    times, encoder = [], []
    for _ in range(iters):
        t0 = time.perf_counter()
        request()
        times.append(time.perf_counter() - t0)
        if encode is not None:
            t0 = time.perf_counter()
            encode()
            encoder.append(time.perf_counter() - t0)
        tick()
    total, enc = float(np.median(times)), float(np.median(encoder)) if encoder else 0.0
    return Result(
        name, w, tokens_per_s=w.batch * w.new_tokens / total, ms_per_step=1000 * (total - enc) / w.new_tokens,
        latency_ms={p: 1000 * float(np.percentile(times, int(p[1:]))) for p in ("p50", "p95", "p99")},
        encoder_ms=1000 * enc, load_s=load_s, iters=iters,
    )


def split_name(name: str) -> tuple[str, dict]:
    """A benchmarked backend and its options: `ort-cpu:concat` and `ort-cpu:inplace` pin ort-cpu's decoder
    (twostep.runtime.backends.ort.KV_CACHES), so both can be measured side by side in one run."""
    from twostep.errors import BadInput
    from twostep.runtime.backends.ort import KV_CACHES

    backend, _, kv_cache = name.partition(":")
    if not kv_cache:
        return backend, {}
    pins = [k for k, decoder in KV_CACHES.items() if decoder is not None]
    if backend != "ort-cpu" or kv_cache not in pins:
        raise BadInput(f"backend {name!r}: only ort-cpu takes a decoder suffix, "
                       + " or ".join(f":{k}" for k in pins))
    return backend, {"kv_cache": kv_cache}


def run_backend(name: str, artifact_dir: Path | None, checkpoint_dir: Path | None, workloads: list[Workload],
                warmup: int, iters: int, threads: int | None, device: str = "cpu",
                tick: Callable[[], None] = lambda: None) -> list[Result]:
    """Measure one backend in this process. Imports stay lazy: an ort-cpu run never imports torch."""
    from twostep.errors import TwostepError
    from twostep.runtime import backends, decoding

    started = time.perf_counter()
    label, (name, options) = name, split_name(name)
    try:
        artifact = None
        if artifact_dir is not None and backends.backend_info(name).needs_artifact:
            from twostep.artifact import load_artifact

            artifact = load_artifact(artifact_dir)
        if threads:
            options["threads"] = threads
        if name == "torch":
            options["device"] = device
        if artifact is not None:
            options.update(backends.workload_options(
                name, artifact.config, rows=max(w.batch * w.beam for w in workloads),
                src_len=max(w.src_len for w in workloads), new_tokens=max(w.new_tokens for w in workloads)))
        backend = backends.create(name, artifact=artifact, checkpoint_dir=checkpoint_dir, **options)
    except TwostepError as exc:
        return [Result(label, w, error=str(exc)) for w in workloads]
    load_s = time.perf_counter() - started
    c = backend.config
    results = []
    with backend:
        for w in workloads:
            sources = make_sources(c.src_vocab_size, c.eos_id, w.batch, w.src_len)
            options = decoding.DecodeOptions(beam_size=w.beam, suppress_eos=True)
            specials = decoding.Specials.of(c)
            session = backend.session()
            ids, mask = decoding.pad_batch(sources, c.pad_id)
            results.append(measure(
                label, w,
                lambda: decoding.decode(session, sources, options, specials=specials, max_new_tokens=w.new_tokens),
                lambda: session.start(ids, mask), warmup, iters, tick, load_s,
            ))
    for r in results:
        r.peak_rss_mb, r.decoder = peak_rss_mb(), backend.decoder
    return results


def _child(queue, target: Callable[..., list[Result]], args: tuple) -> None:
    try:
        results = target(*args, tick=lambda: queue.put(("tick", None)))
        queue.put(("done", [r.to_dict() for r in results]))
    except BaseException as exc:  # a bug in the child: hand the traceback to the parent
        import traceback

        queue.put(("crash", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class ChildDied(Exception):
    """A benchmark child that ended without a result: killed, out of memory, or crashed in native code."""


def exit_reason(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode} before reporting a result"


def run_in_child(target: Callable[..., list[Result]], args: tuple, tick: Callable[[], None] = lambda: None,
                 poll_s: float = 0.5) -> list[Result]:
    """Run `target(*args, tick=...)` in a fresh spawned process; `target` must be a module-level function.
    Raises ChildDied when the child ends without a result, instead of waiting for one forever."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=_child, args=(results, target, args))
    child.start()
    try:
        while True:
            try:
                kind, payload = results.get(timeout=poll_s)
            except queue.Empty:
                if child.is_alive():
                    continue
                try:  # what it sent just before it ended is still in the pipe
                    kind, payload = results.get(timeout=poll_s)
                except queue.Empty:
                    child.join()
                    raise ChildDied(exit_reason(child.exitcode)) from None
            if kind != "tick":
                break
            tick()
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
            child.join()
    if kind == "crash":
        raise RuntimeError(f"benchmark child {target.__name__}{args[:1]} crashed:\n{payload}")
    return [Result(**{**d, "workload": Workload(**d["workload"])}) for d in payload]


def bench(backend_names: list[str], artifact_dir: Path | None, checkpoint_dir: Path | None, workloads: list[Workload],
          warmup: int = 3, iters: int = 5, threads: int | None = None, device: str = "cpu",
          tick: Callable[[], None] = lambda: None) -> list[Result]:
    """Run each backend in a fresh child process, one after the other; results in backend order. A backend
    whose process dies gets error rows, and the others are still measured."""
    out: list[Result] = []
    for name in backend_names:
        args = (name, artifact_dir, checkpoint_dir, workloads, warmup, iters, threads, device)
        try:
            out += run_in_child(run_backend, args, tick)
        except ChildDied as exc:
            out += [Result(name, w, error=f"its benchmark process died ({exc})") for w in workloads]
    return out
