"""`twostep bench`: every backend on the same inputs, with a fixed output length (EOS suppressed) so that
backends do equal work.

Each backend runs in its own child process, so that its load time and peak RSS are its own and one
backend's allocations do not slow the next; the parent shows progress and gathers the results.

A batched step is bound by its weight products: the parent times ONNX Runtime on those products alone (the
GEMM floor, `gemm_floor`) and reads each batched ort-cpu step as a multiple of it.
"""

from __future__ import annotations

import multiprocessing
import queue
import resource
import signal
import tempfile
import time
from collections import Counter
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
    gemm_floor_ms: float | None = None  # batched ort-cpu rows: the step's weight products alone (gemm_floor)
    gemm_gflops: float | None = None  # the rate of those products that the floor implies
    step_vs_gemm_floor: float | None = None  # ms_per_step / gemm_floor_ms

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


INT8_PRODUCTS = ("MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat")
WEIGHT_PRODUCTS = ("MatMul", "Gemm", *INT8_PRODUCTS)
INT4_PRODUCT = "MatMulNBits"  # its weight packed in blocks: K and N are attributes


@dataclass(frozen=True)
class Product:
    """`count` products of (rows, k) activations by a (k, n) weight, int8, int4 or float."""

    k: int
    n: int
    count: int = 1
    int8: bool = False
    int4: bool = False


def gemm_products(graph_file: Path) -> list[Product]:
    """The weight products of one step of this graph, one Product per distinct (k, n, int8, int4): its MatMuls
    and Gemms, quantized or not, whose weight is an initializer, directly or through Transpose, Cast or
    DequantizeLinear, and its MatMulNBits. Attention's products of two activations are not weight products."""
    import onnx

    graph = onnx.load(str(graph_file), load_external_data=False).graph
    dims = {t.name: list(t.dims) for t in graph.initializer}
    producer = {name: node for node in graph.node for name in node.output}

    def attrs(node) -> dict:
        return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}

    def weight(name: str) -> list[int] | None:  # the weight's shape as the product reads it; None: an activation
        if name in dims:
            return dims[name]
        node = producer.get(name)
        if node is None or node.op_type not in ("Transpose", "Cast", "DequantizeLinear"):
            return None
        shape = weight(node.input[0])
        if shape is None or node.op_type != "Transpose":
            return shape
        return [shape[i] for i in attrs(node).get("perm", range(len(shape) - 1, -1, -1))]

    counts: Counter = Counter()
    for node in graph.node:
        if node.op_type == INT4_PRODUCT:
            counts[attrs(node)["K"], attrs(node)["N"], False, True] += 1
            continue
        shape = weight(node.input[1]) if node.op_type in WEIGHT_PRODUCTS else None
        if shape is None or len(shape) != 2:
            continue
        k, n = shape[::-1] if node.op_type == "Gemm" and attrs(node).get("transB") else shape
        counts[k, n, node.op_type in INT8_PRODUCTS, False] += 1
    return [Product(k, n, count, int8, int4) for (k, n, int8, int4), count in counts.items()]


@dataclass(frozen=True)
class Floor:
    """ONNX Runtime's time for a step's weight products alone at `rows` rows: each product with the median ms
    of one of them."""

    rows: int
    timed: tuple[tuple[Product, float], ...]

    @property
    def ms(self) -> float:
        return sum(p.count * ms for p, ms in self.timed)

    @property
    def flops(self) -> int:
        return sum(2 * self.rows * p.k * p.n * p.count for p, _ in self.timed)

    @property
    def gflops(self) -> float:
        return self.flops / self.ms / 1e6

    def rates(self) -> str:
        """Each product's rate, e.g. `512x2048 fp32 x6: 95.1 GFLOP/s`."""
        return ", ".join(f"{p.k}x{p.n} {'int8' if p.int8 else 'int4' if p.int4 else 'fp32'} x{p.count}: "
                         f"{2 * self.rows * p.k * p.n / ms / 1e6:.1f} GFLOP/s" for p, ms in self.timed)


def gemm_floor(products: list[Product], rows: int, threads: int | None = 2, repeats: int = 10,
               warmup: int = 2) -> Floor:
    """Time each product in this process as a one-node ONNX model: a (rows, k) input by a random (k, n)
    initializer, for int8 and int4 quantized as the exporter quantizes. Sessions as ort-cpu opens them
    (all graph optimizations, which fuse the int8 ops; `threads` intra-op threads, None: ONNX Runtime's
    default), except that pool threads keep spinning between runs, as they do between a step's operators.
    Float weights are timed as fp32. A weight that fits in the caches stays there between repeats: at a few
    rows, where a step is bound by reading its weights, this floor can be below the weight-read one."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from twostep.exporter.int4 import quantize_int4
    from twostep.exporter.quantize import quantize_int8
    from twostep.runtime.backends.ortlib import import_ort

    ort = import_ort()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.log_severity_level = 3
    rng = np.random.default_rng(0)
    timed = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in products:
            path = Path(tmp) / f"{p.k}x{p.n}.onnx"
            w = numpy_helper.from_array(rng.standard_normal((p.k, p.n), dtype=np.float32), "w")
            graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "product",
                                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, p.k])],
                                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, p.n])], [w])
            onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
            if p.int8:
                quantize_int8(path)
            if p.int4:
                quantize_int4(path)
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            feed = {"x": rng.standard_normal((rows, p.k), dtype=np.float32)}
            for _ in range(warmup):
                session.run(None, feed)
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                session.run(None, feed)
                times.append(time.perf_counter() - started)
            timed.append((p, 1000 * float(np.median(times))))
    return Floor(rows, tuple(timed))


def measure(name: str, w: Workload, request: Callable[[], None], encode: Callable[[], None] | None,
            warmup: int, iters: int, tick: Callable[[], None] = lambda: None, load_s: float = 0.0) -> Result:
    """Median whole-request time over `iters` after `warmup`; `encode` alone is timed (its fastest run) to split
    off the encoder."""
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
    total = float(np.median(times))
    # The encoder is part of every request: its fastest run, never more than the request's median, so that a
    # noisy encoder run cannot give a negative step time.
    enc = min(float(np.min(encoder)), total) if encoder else 0.0
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
    whose process dies gets error rows, and the others are still measured. Then the GEMM floors of the batched
    ort-cpu results, in this process."""
    out: list[Result] = []
    for name in backend_names:
        args = (name, artifact_dir, checkpoint_dir, workloads, warmup, iters, threads, device)
        try:
            out += run_in_child(run_backend, args, tick)
        except ChildDied as exc:
            out += [Result(name, w, error=f"its benchmark process died ({exc})") for w in workloads]
    if artifact_dir is not None:
        from twostep.artifact import load_artifact

        artifact = load_artifact(artifact_dir, check_hashes=False)
        ort_cpu = {name for name in backend_names if split_name(name)[0] == "ort-cpu"}
        add_gemm_floors(out, lambda r: artifact.graph_file(r.decoder) if r.backend in ort_cpu else None, threads)
    return out


def add_gemm_floors(results: list[Result], graph_of: Callable[[Result], Path | None],
                    threads: int | None) -> dict[tuple[Path, int], Floor]:
    """Read each batched result (batch x beam rows > 1) against the GEMM floor of its decoder graph,
    `graph_of(result)` (None: no floor), at its rows; each floor measured here once per (graph, rows), after
    the engines. Returns the floors. Batch 1 is bound by reading the weights instead (weight_bytes_per_step)."""
    floors: dict[tuple[Path, int], Floor] = {}
    for r in results:
        rows = r.workload.batch * r.workload.beam
        graph = graph_of(r) if r.error is None and rows > 1 else None
        if graph is None:
            continue
        if (graph, rows) not in floors:
            floors[graph, rows] = gemm_floor(gemm_products(graph), rows, threads)
        floor = floors[graph, rows]
        r.gemm_floor_ms, r.gemm_gflops, r.step_vs_gemm_floor = floor.ms, floor.gflops, r.ms_per_step / floor.ms
    return floors
