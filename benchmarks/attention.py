"""One decoder layer's self-attention over a cache buffer, written in place, as each operator ONNX Runtime's CPU
provider offers for it, timed side by side (`python -m benchmarks.beam_profile ARTIFACT --attention`):

gqa          com.microsoft GroupQueryAttention (as many K/V heads as query heads): the packed q|k|v of the new
             token, the cache, each row's length; writes the new K/V at the row's length and attends over the
             row's own positions (today's in-place decoder)
standard     opset 24: TensorScatter writes the new K/V at each row's length (`write_indices`), Attention attends
             over the whole buffer with each row's length (`nonpad_kv_seqlen`)
masked       as `standard`, Attention told each row's length by a boolean mask (rows, 1, 1, capacity) instead:
             the form twostep exports (decoder_inplace_standard), as TensorRT's parser refuses nonpad_kv_seqlen
mha          com.microsoft MultiHeadAttention with past_sequence_length: one past length for the batch, rows
             told apart by a key padding mask (rows, past + 1)
dmmha        com.microsoft DecoderMaskedMultiHeadAttention with a shared buffer and beam search's cache
             indirection (rows, beam, capacity): a beam reads its history through it, so the cache is never
             reordered
matmul       TensorScatter as in `standard`, then attention as two batched products over the whole buffer
             (scores = q Kᵀ, which ONNX Runtime fuses into one FusedMatMul, masked with an additive bias
             from the lengths; softmax; probabilities V)

Every graph's cache is a graph input and output bound (IO binding) to one OrtValue over the caller's buffer:
`in place` says whether the present output's data pointer was the buffer's and the step's K/V landed in it.
Each graph's attention output is checked against numpy before it is timed. `reorder` is what beam search's
cache reorder costs a layer per step without cache indirection (twostep.runtime.backends.inplace: the rows
whose beam of origin is another row copy that row's filled positions, K and V), for a random choice of beams.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
from onnx import TensorProto, helper

F32, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
VARIANTS = ("gqa", "standard", "masked", "mha", "dmmha", "matmul")


def _v(name: str, kind: int, shape) -> helper.ValueInfoProto:
    return helper.make_tensor_value_info(name, kind, shape)


def _heads(x: str, out: str, heads: int, dim: int) -> list:
    """[B, T, H * Dh] -> [B, H, T, Dh]"""
    return [helper.make_node("Reshape", [x, "split_heads"], [out + "_bthd"]),
            helper.make_node("Transpose", [out + "_bthd"], [out], perm=[0, 2, 1, 3])]


def _merge(x: str, out: str) -> list:
    """[B, H, T, Dh] -> [B, T, H * Dh]"""
    return [helper.make_node("Transpose", [x], [x + "_bthd"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [x + "_bthd", "merge_heads"], [out])]


def variant_model(name: str, heads: int, dim: int) -> bytes:
    """The graph of one variant: new token's q, k, v (or packed qkv) and the cache in, attention and the cache out."""
    d = heads * dim
    cache = ["rows", heads, "capacity", dim]
    cache_io = [_v("past_key", F32, cache), _v("past_value", F32, cache)]
    cache_out = [_v("present_key", F32, cache), _v("present_value", F32, cache)]
    out = _v("attention", F32, ["rows", 1, d])
    split = helper.make_tensor("split_heads", I64, [4], [0, 0, heads, dim])
    merge = helper.make_tensor("merge_heads", I64, [3], [0, 0, d])
    qkv = [_v(n, F32, ["rows", 1, d]) for n in ("q", "k", "v")]
    scale = 1.0 / np.sqrt(dim)
    ms = helper.make_opsetid("com.microsoft", 1)
    opsets, inits = [helper.make_opsetid("", 24)], [split, merge]
    if name == "gqa":
        inputs = [_v("qkv", F32, ["rows", 1, 3 * d]), *cache_io, _v("seqlens_k", I32, ["rows"]),
                  _v("total", I32, [])]
        nodes = [helper.make_node("GroupQueryAttention",
                                  ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total"],
                                  ["attention", "present_key", "present_value"], domain="com.microsoft",
                                  num_heads=heads, kv_num_heads=heads, scale=scale)]
        opsets.append(ms)
    elif name in ("mha", "dmmha"):
        inputs = [*qkv, _v("key_padding_mask", I32, ["rows", "total"]), *cache_io, _v("past_sequence_length", I32, [1])]
        if name == "mha":
            nodes = [helper.make_node("MultiHeadAttention",
                                      ["q", "k", "v", "", "key_padding_mask", "", "past_key", "past_value",
                                       "past_sequence_length"],
                                      ["attention", "present_key", "present_value"], domain="com.microsoft",
                                      num_heads=heads, scale=scale)]
        else:
            inputs += [_v("beam_width", I32, [1]), _v("cache_indirection", I32, ["batch", "beam", "capacity"])]
            nodes = [helper.make_node("DecoderMaskedMultiHeadAttention",
                                      ["q", "k", "v", "key_padding_mask", "", "past_key", "past_value",
                                       "past_sequence_length", "beam_width", "cache_indirection"],
                                      ["attention", "present_key", "present_value"], domain="com.microsoft",
                                      num_heads=heads, scale=scale, past_present_share_buffer=1)]
        opsets.append(ms)
    elif name in ("standard", "masked", "matmul"):
        inputs = [*qkv, *cache_io, _v("write_indices", I64, ["rows"]), _v("lengths", I64, ["rows"])]
        if name == "masked":
            inputs[-1] = _v("mask", TensorProto.BOOL, ["rows", 1, 1, "capacity"])
        nodes = [*_heads("q", "q4", heads, dim), *_heads("k", "k4", heads, dim), *_heads("v", "v4", heads, dim),
                 helper.make_node("TensorScatter", ["past_key", "k4", "write_indices"], ["present_key"], axis=2),
                 helper.make_node("TensorScatter", ["past_value", "v4", "write_indices"], ["present_value"], axis=2)]
        if name == "standard":
            nodes.append(helper.make_node("Attention", ["q4", "present_key", "present_value", "", "", "", "lengths"],
                                          ["y"], scale=scale))
        elif name == "masked":
            nodes.append(helper.make_node("Attention", ["q4", "present_key", "present_value", "mask"], ["y"],
                                          scale=scale))
        else:
            inits += [helper.make_tensor("scale", F32, [], [scale]), helper.make_tensor("ninf", F32, [], [-1e30]),
                      helper.make_tensor("zero", F32, [], [0.0]),
                      helper.make_tensor("lengths_shape", I64, [4], [-1, 1, 1, 1]),
                      helper.make_tensor("i0", I64, [], [0]), helper.make_tensor("i1", I64, [], [1])]
            nodes += [helper.make_node("Mul", ["q4", "scale"], ["qs"]),
                      helper.make_node("Transpose", ["present_key"], ["kt"], perm=[0, 1, 3, 2]),
                      helper.make_node("MatMul", ["qs", "kt"], ["scores"]),
                      helper.make_node("Shape", ["present_key"], ["cap"], start=2, end=3),
                      helper.make_node("Squeeze", ["cap"], ["cap0"]),
                      helper.make_node("Range", ["i0", "cap0", "i1"], ["positions"]),
                      helper.make_node("Reshape", ["lengths", "lengths_shape"], ["lengths4"]),
                      helper.make_node("Less", ["positions", "lengths4"], ["valid"]),
                      helper.make_node("Where", ["valid", "zero", "ninf"], ["bias"]),
                      helper.make_node("Add", ["scores", "bias"], ["masked"]),
                      helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
                      helper.make_node("MatMul", ["probs", "present_value"], ["y"])]
        nodes += _merge("y", "attention")
    else:
        raise ValueError(f"unknown variant {name!r}")
    graph = helper.make_graph(nodes, name, inputs, [out, *cache_out], initializer=inits)
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def reference(q, k, v, cache_k, cache_v, lengths) -> np.ndarray:
    """numpy: row r attends over its lengths[r] cached positions and the new one."""
    rows, heads, _, dim = cache_k.shape
    out = np.empty((rows, 1, heads * dim), np.float32)
    for r, n in enumerate(lengths):
        keys = np.concatenate([cache_k[r, :, :n], k[r, 0].reshape(heads, 1, dim)], axis=1)
        values = np.concatenate([cache_v[r, :, :n], v[r, 0].reshape(heads, 1, dim)], axis=1)
        qr = q[r, 0].reshape(heads, 1, dim)
        s = qr @ keys.transpose(0, 2, 1) / np.sqrt(dim)
        p = np.exp(s - s.max(-1, keepdims=True))
        out[r, 0] = ((p / p.sum(-1, keepdims=True)) @ values).reshape(-1)
    return out


class Variant:
    """One variant's session at a row count, past and capacity, bound once; `run()` is one step."""

    def __init__(self, ort, name: str, heads: int, dim: int, rows: int, past: int, capacity: int, beam: int,
                 threads: int, seed: int = 0):
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(variant_model(name, heads, dim), options,
                                            providers=["CPUExecutionProvider"])
        g = np.random.default_rng(seed)
        d = heads * dim
        self.q, self.k, self.v = (g.standard_normal((rows, 1, d), dtype=np.float32) for _ in range(3))
        self.cache = {n: g.standard_normal((rows, heads, capacity, dim), dtype=np.float32) for n in ("key", "value")}
        self.before = {n: c.copy() for n, c in self.cache.items()}
        self.lengths, self.past, self.heads, self.dim = np.full(rows, past), past, heads, dim
        feeds = {}
        if name == "gqa":
            feeds = {"qkv": np.concatenate([self.q, self.k, self.v], axis=2),
                     "seqlens_k": self.lengths.astype(np.int32), "total": np.array(past + 1, np.int32)}
        elif name in ("mha", "dmmha"):
            feeds = {"q": self.q, "k": self.k, "v": self.v, "key_padding_mask": np.ones((rows, past + 1), np.int32),
                     "past_sequence_length": np.array([past], np.int32)}
            if name == "dmmha":
                feeds["beam_width"] = np.array([beam], np.int32)
                # each beam reads its own history: the indirection of a search whose beams never swapped
                feeds["cache_indirection"] = np.broadcast_to(np.arange(beam, dtype=np.int32)[None, :, None],
                                                             (rows // beam, beam, capacity)).copy()
        else:
            feeds = {"q": self.q, "k": self.k, "v": self.v, "write_indices": self.lengths.astype(np.int64),
                     "lengths": (self.lengths + 1).astype(np.int64)}
            if name == "masked":
                del feeds["lengths"]
                feeds["mask"] = (np.arange(capacity) <= self.lengths[:, None])[:, None, None]
        self.feeds = feeds
        self.binding = self.session.io_binding()
        self.binding.bind_output("attention")
        for n, a in feeds.items():
            self.binding.bind_cpu_input(n, a)
        for n, c in self.cache.items():
            value = ort.OrtValue.ortvalue_from_numpy(c)
            self.binding.bind_ortvalue_input(f"past_{n}", value)
            self.binding.bind_ortvalue_output(f"present_{n}", value)

    def run(self) -> None:
        self.session.run_with_iobinding(self.binding)

    def check(self) -> bool:
        """Run once, compare with numpy, and say whether the cache was written in place."""
        self.run()
        outputs = self.binding.get_outputs()
        got = outputs[0].numpy()
        want = reference(self.q, self.k, self.v, self.before["key"], self.before["value"], self.lengths)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        rows = len(self.lengths)
        new = (("key", self.k), ("value", self.v))
        written = all(np.array_equal(self.cache[n][:, :, self.past], x.reshape(rows, self.heads, self.dim))
                      for n, x in new)
        same = all(o.data_ptr() == self.cache[n].ctypes.data for o, n in zip(outputs[1:], ("key", "value")))
        return written and same


def interleaved_us(runs: dict, iters: int) -> dict[str, float]:
    """Median µs per call of each function, called in turn `iters` times over (this host drifts by more than
    the differences between variants within a minute: run side by side, one call each in turn)."""
    times = {name: [] for name in runs}
    for _ in range(iters):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    return {name: 1e6 * statistics.median(t) for name, t in times.items()}


def reorder(rows: int, heads: int, dim: int, past: int, capacity: int, beam: int):
    """twostep's in-place reorder of one layer's K and V (twostep.runtime.backends.inplace) for a random choice
    of beams at each call: each row's beam of origin drawn from its sentence's beams."""
    g = np.random.default_rng(1)
    cache = [g.standard_normal((rows, heads, capacity, dim), dtype=np.float32) for _ in range(2)]
    base = np.repeat(np.arange(0, rows, beam), beam)

    def step():
        origin = base + g.integers(0, beam, rows)
        moved = np.flatnonzero(origin != np.arange(rows))
        for buffer in cache:
            buffer[moved, :, :past] = buffer[origin[moved], :, :past]

    return step


def capacity_for(positions: int, first: int = 32) -> int:
    """The in-place session's capacity for `positions`: the first capacity doubled until it fits."""
    capacity = first
    while capacity < positions:
        capacity *= 2
    return capacity


def ready(ort, heads, dim, rows, past, capacity, beam, threads, inplace: dict) -> dict:
    """Each variant's step, checked against numpy (and whether it wrote in place, into `inplace`), warmed up."""
    runs = {}
    for name in VARIANTS:
        variant = Variant(ort, name, heads, dim, rows, past, capacity, beam, threads)
        inplace[name] = variant.check() and inplace.get(name, True)
        for _ in range(3):
            variant.run()
        runs[name] = variant.run
    return runs


def measure(ort, heads: int, dim: int, rows_list, pasts, beam: int, threads: int, iters: int,
            ratios=(1, 2, 8)) -> str:
    """The markdown tables: each variant at each rows x past (the in-place session's capacity), with the beam
    reorder a layer costs without cache indirection, then the capacity sweep (the variants that work over the
    whole buffer pay for its capacity)."""
    lines = ["| rows | past | capacity | " + " | ".join(VARIANTS)
             + " | reorder (copy) | gqa + reorder | dmmha / (gqa + reorder) |",
             "|---:|---:|---:|" + "---:|" * (len(VARIANTS) + 3)]
    inplace: dict[str, bool] = {}
    for rows in rows_list:
        for past in pasts:
            capacity = capacity_for(past + 1)
            runs = ready(ort, heads, dim, rows, past, capacity, beam, threads, inplace)
            runs["reorder"] = reorder(rows, heads, dim, past, capacity, beam)
            us = interleaved_us(runs, iters)
            copied = us["gqa"] + us["reorder"]
            cells = [f"{us[name]:,.0f}" for name in (*VARIANTS, "reorder")]
            cells += [f"{copied:,.0f}", f"{us['dmmha'] / copied:.2f}"]
            lines.append(f"| {rows} | {past} | {capacity} | " + " | ".join(cells) + " |")
    lines += ["", "| variant | cache written in place (present's data pointer is the buffer's, the new K/V in it) |",
              "|---|---|"]
    lines += [f"| {name} | {'yes' if ok else 'no'} |" for name, ok in inplace.items()]
    past, rows = max(pasts), max(rows_list)
    lines += ["", f"Capacity against the valid length ({rows} rows, past {past}, µs):", "",
              "| capacity / (past + 1) | capacity | " + " | ".join(VARIANTS) + " |",
              "|---:|---:|" + "---:|" * len(VARIANTS)]
    for ratio in ratios:
        capacity = ratio * (past + 1)
        us = interleaved_us(ready(ort, heads, dim, rows, past, capacity, beam, threads, {}), iters)
        lines.append(f"| {ratio} | {capacity} | " + " | ".join(f"{us[name]:,.0f}" for name in VARIANTS) + " |")
    return "\n".join(lines)
