"""Validation: the graphs against their declaration, then values against eager PyTorch in fp32 on a grid of
shapes different from the trace shapes, with a per-output tolerance table. Every failure is reported at once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from twostep.artifact.spec import GraphSpec, past_name
from twostep.runtime.backends.base import Backend


@dataclass(frozen=True)
class Grid:
    """The shapes parity is checked on: the encoder on every (batch, src_len), the decoder on every (batch,
    src_len, past_len, new_len), and a variant decoder driven step by step (compare_sessions) on each of
    `sessions`' (batch, src_len). In a batch of 3, rows are at different positions (past_lengths p, p - 7,
    p - 14, at least 0): the columns before a row's own are other tokens' K/V, which the graph must mask."""
    batch: tuple[int, ...]
    src_len: tuple[int, ...]
    past_len: tuple[int, ...]
    new_len: tuple[int, ...]
    sessions: tuple[tuple[int, int], ...]

    def axes(self) -> dict[str, tuple[int, ...]]:
        return {"batch": self.batch, "src_len": self.src_len, "past_len": self.past_len, "new_len": self.new_len}

    def to_dict(self) -> dict:
        """As the manifest's JSON holds it."""
        return {**{axis: list(sizes) for axis, sizes in self.axes().items()},
                "sessions": [list(pair) for pair in self.sessions]}


# `twostep verify`'s: batch 1 and 3; source lengths 1, 7 and 33 with padding; past 0, 1 and 17; new tokens 1
# and 4 (42 graph cases); sessions on all six (batch, src_len).
FULL_GRID = Grid(batch=(1, 3), src_len=(1, 7, 33), past_len=(0, 1, 17), new_len=(1, 4),
                 sessions=tuple(itertools.product((1, 3), (1, 7, 33))))
# `twostep export`'s: the same edges (batch 1, a source of 1, an empty past, one new token) and the far sizes,
# without the middle ones (20 graph cases); sessions on a lone row with a one-token source and on the batch of
# 3 with padding, where rows trade places, leave and join. Most of the time is the eager reference.
EXPORT_GRID = Grid(batch=(1, 3), src_len=(1, 33), past_len=(0, 17), new_len=(1, 4), sessions=((1, 1), (3, 33)))

# (atol, rtol) per output kind and weight precision; "logits" and "kv" (every K/V tensor). int8 has none:
# its errors are reported, and what it must pass is token agreement with fp32 eager (twostep verify).
TOLERANCES = {
    "fp32": {"logits": (1e-4, 1e-4), "kv": (1e-4, 1e-4)},
    "tf32": {"logits": (2e-2, 2e-2), "kv": (1e-2, 1e-2)},  # fp32 graphs on TF32 tensor cores (opt-in, ort-trt)
    "fp16": {"logits": (5e-2, 5e-2), "kv": (2e-2, 2e-2)},
    "int8": None,
    "int4": None,
}
# Share of whole greedy/beam sequences that must equal fp32 eager's. int4: the demo model keeps 999 or 1000 of its
# 1000 test sentences, greedy and beam 4, at every block size, symmetry and accuracy level tried (int8: 1000);
# int4's logits are 4-5 times as far from fp32's as int8's, so twice int8's allowance.
REQUIRED_AGREEMENT = {"fp32": 1.0, "tf32": 0.99, "fp16": 0.99, "int8": 0.99, "int4": 0.98}

ONNX_TYPE_NAMES = {onnx.TensorProto.INT64: "int64", onnx.TensorProto.FLOAT: "float32",
                   onnx.TensorProto.FLOAT16: "float16"}


@dataclass
class ParityReport:
    max_error: dict[str, float] = field(default_factory=dict)  # "graph.output" -> max |a - b| over the grid
    failures: list[str] = field(default_factory=list)
    cases: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict:
        return {"ok": self.ok, "cases": self.cases, "max_error": self.max_error, "failures": self.failures}


def check_declaration(path: Path, spec: GraphSpec) -> list[str]:
    """onnx.checker, then names, dtypes and dims of the graph equal to the declaration."""
    problems = []
    try:
        onnx.checker.check_model(str(path), full_check=False)
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # the checker raises ValidationError, protobuf DecodeError, ...
        return [f"{path.name}: onnx.checker: {str(exc).splitlines()[0][:300]}"]

    def describe(values) -> list[tuple[str, str, tuple]]:
        out = []
        for v in values:
            t = v.type.tensor_type
            dims = tuple(d.dim_param if d.dim_param else d.dim_value if d.HasField("dim_value") else "?"
                         for d in t.shape.dim)
            out.append((v.name, ONNX_TYPE_NAMES.get(t.elem_type, str(t.elem_type)), dims))
        return out

    for kind, declared, actual in (("input", spec.inputs, describe(model.graph.input)),
                                   ("output", spec.outputs, describe(model.graph.output))):
        if [t.name for t in declared] != [a[0] for a in actual]:
            problems.append(f"{path.name}: {kind} names {[a[0] for a in actual]} != declared "
                            f"{[t.name for t in declared]}")
            continue
        for t, (_, dtype, dims) in zip(declared, actual):
            if dtype != t.dtype:
                problems.append(f"{path.name}: {kind} {t.name} is {dtype}, declared {t.dtype}")
            if len(dims) != len(t.shape):
                problems.append(f"{path.name}: {kind} {t.name} has rank {len(dims)}, declared {len(t.shape)}")
                continue
            for axis, (want, got) in enumerate(zip(t.shape, dims)):
                if isinstance(want, int) and got != want:
                    problems.append(f"{path.name}: {kind} {t.name} axis {axis} is {got!r}, declared {want}")
                if isinstance(want, str) and not isinstance(got, str):
                    problems.append(f"{path.name}: {kind} {t.name} axis {axis} ({want}) is static {got}, "
                                    "declared dynamic")
                elif isinstance(want, str) and " " not in want and got != want:
                    problems.append(f"{path.name}: {kind} {t.name} axis {axis} is named {got!r}, declared {want!r}")
    return problems


def grid_feeds(reference: Backend, grid: Grid = FULL_GRID, seed: int = 0):
    """(case name, graph, feeds) over the shape grid; decoder pasts come from the reference itself."""
    c = reference.config
    rng = np.random.default_rng(seed)
    for batch, src_len in itertools.product(grid.batch, grid.src_len):
        ids = rng.integers(min(4, c.src_vocab_size - 1), c.src_vocab_size, (batch, src_len), dtype=np.int64)
        mask = np.ones((batch, src_len), dtype=np.int64)
        for row in range(1, batch):  # padding: rows 1.. are shorter
            mask[row, max(1, src_len // (row + 1)):] = 0
        ids = np.where(mask == 1, ids, c.pad_id)
        enc_feeds = {"input_ids": ids, "attention_mask": mask}
        yield f"b{batch}_s{src_len}", "encoder", enc_feeds
        cross = reference.run("encoder", enc_feeds)
        cross_feeds = {past_name(k): v for k, v in cross.items()}
        for past_len, new_len in itertools.product(grid.past_len, grid.new_len):
            if past_len:
                prefix = rng.integers(min(4, c.tgt_vocab_size - 1), c.tgt_vocab_size, (batch, past_len), dtype=np.int64)
                out = reference.run("decoder", {"input_ids": prefix, "encoder_attention_mask": mask,
                                                "past_lengths": np.zeros(batch, np.int64), **cross_feeds,
                                                **empty_past(reference, batch)})
                self_feeds = {past_name(k): v for k, v in out.items() if k.startswith("present_")}
            else:
                self_feeds = empty_past(reference, batch)
            lengths = np.maximum(past_len - 7 * np.arange(batch), 0)
            new = rng.integers(min(4, c.tgt_vocab_size - 1), c.tgt_vocab_size, (batch, new_len), dtype=np.int64)
            feeds = {"input_ids": new, "encoder_attention_mask": mask, "past_lengths": lengths, **cross_feeds,
                     **self_feeds}
            yield f"b{batch}_s{src_len}_p{past_len}_n{new_len}", "decoder", feeds


def empty_past(backend: Backend, batch: int) -> dict[str, np.ndarray]:
    """Zero-length fp32 self-attention caches (the reference runs fp32; compare_graphs casts for fp16)."""
    return {t.name: np.zeros(t.concrete(batch=batch, past_len=0), np.float32)
            for t in backend.graphs["decoder"].past_self}


def compare_graphs(candidate: Backend, reference: Backend, precision: str = "fp32",
                   grid: Grid = FULL_GRID) -> ParityReport:
    """Run both backends on the shape grid and compare every output with its tolerance."""
    report = ParityReport()
    tolerances = TOLERANCES[precision]
    graph_dtype = candidate.graphs["decoder"].outputs[0].dtype  # an fp32 graph may run fp16 (trt --fp16)
    cast = np.float16 if graph_dtype == "float16" else np.float32
    for case, graph, feeds in grid_feeds(reference, grid):
        expected = reference.run(graph, feeds)
        cand_feeds = {k: (v.astype(cast) if v.dtype == np.float32 else v) for k, v in feeds.items()}
        got = candidate.run(graph, cand_feeds)
        report.cases += 1
        if "top_ids" in expected:
            report.failures += search_failures(case, graph, got, expected["logits"][:, -1], tolerances)
        for name, want in expected.items():
            if name == "top_ids":  # ids of equal logits may come in either order: search_failures checks them
                continue
            have = got[name].astype(np.float32)
            key = f"{graph}.{name}"
            if have.shape != want.shape:
                report.failures.append(f"{case}: {key} has shape {have.shape}, expected {want.shape}")
                continue
            err = float(np.abs(have - want).max()) if want.size else 0.0
            report.max_error[key] = max(report.max_error.get(key, 0.0), err)
            if not np.isfinite(have).all():
                report.failures.append(f"{case}: {key} has NaN or infinite values")
            elif tolerances is not None:
                atol, rtol = tolerances["logits" if name == "logits" else "kv"]
                if not np.allclose(have, want, atol=atol, rtol=rtol):
                    report.failures.append(f"{case}: {key} max error {err:.3g} > atol {atol:g} + rtol {rtol:g}")
    return report


def compare_backend(candidate: Backend, reference: Backend, precision: str = "fp32",
                    grid: Grid = FULL_GRID) -> ParityReport:
    """What export (EXPORT_GRID) and verify (FULL_GRID) check: the graphs on the shape grid, then, where the
    candidate decodes with a variant of the decoder (ort-cpu's in-place one), that decoder step by step."""
    report = compare_graphs(candidate, reference, precision, grid)
    if candidate.decoder == "decoder":
        return report
    return compare_sessions(candidate, reference, precision, report, grid=grid)


def search_failures(case: str, graph: str, got: dict[str, np.ndarray], logits: np.ndarray,
                    tolerances: dict | None) -> list[str]:
    """The candidate's search outputs against the reference's last-position logits (B, V): each of its top ids
    has the reference logit its top_logits says, and its log_norm is the reference's float64 one, within the
    logits' tolerance (ids of logits closer than that may trade places)."""
    if tolerances is None:
        return []
    atol, rtol = tolerances["logits"]
    logits = logits.astype(np.float64)
    ids, top = got["top_ids"], got["top_logits"].astype(np.float64)
    failures = []
    if ids.shape != top.shape or ids.shape[0] != logits.shape[0]:
        return [f"{case}: {graph} search outputs have shapes {ids.shape} and {top.shape} for {logits.shape[0]} rows"]
    width = ids.shape[1]
    want_top = -np.sort(-logits, axis=1)[:, :width]
    if (ids < 0).any() or (ids >= logits.shape[1]).any() or not np.allclose(
            np.take_along_axis(logits, ids, 1), top, atol=atol, rtol=rtol):
        failures.append(f"{case}: {graph}.top_ids are not the ids of top_logits")
    if not np.allclose(top, want_top, atol=atol, rtol=rtol):
        failures.append(f"{case}: {graph}.top_logits are not the {width} largest logits")
    want_norm = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1))
    if not np.allclose(got["log_norm"].astype(np.float64), want_norm, atol=atol, rtol=rtol):
        failures.append(f"{case}: {graph}.log_norm is not log(sum(exp(logits - max)))")
    return failures


def compare_sessions(candidate: Backend, reference: Backend, precision: str = "fp32",
                     report: ParityReport | None = None, seed: int = 1, grid: Grid = FULL_GRID) -> ParityReport:
    """The candidate's decoder (candidate.session(): the in-place decoder's, say) against the reference's
    session, step by step on the grid's `sessions` (batch, source length): a 4-token first step, then one
    token a step past the first capacity (so the buffer grows), a beam-style reorder of the cache, a row
    leaving the batch, a row freed, then two sentences joining (one in the freed row, one in a new row, with a
    longer source than the batch's), which then decode next to rows that are 17 positions further on. Tokens
    are drawn at random, not decoded, so both sides see the same inputs; every step's logits are compared."""
    report = report or ParityReport()
    tolerances = TOLERANCES[precision]
    c = reference.config
    rng = np.random.default_rng(seed)
    key = f"{candidate.decoder}.logits"
    for batch, src_len in grid.sessions:
        ids = rng.integers(min(4, c.src_vocab_size - 1), c.src_vocab_size, (batch, src_len), dtype=np.int64)
        mask = np.ones((batch, src_len), dtype=np.int64)
        mask[1:, max(1, src_len // 2):] = 0
        sessions = candidate.session(), reference.session()
        for s in sessions:
            s.start(ids, mask)
        rows, position, case = batch, 0, f"b{batch}_s{src_len}"
        for step in range(min(38, c.max_positions - 3)):
            new = 4 if step == 0 else 1
            tokens = rng.integers(min(4, c.tgt_vocab_size - 1), c.tgt_vocab_size, (rows, new), dtype=np.int64)
            results, want = sessions[0].search_step(tokens), sessions[1].step(tokens)
            have = results["logits"]
            if "top_ids" in results:
                report.failures += search_failures(f"{case}_p{position + new}", candidate.decoder, results, want,
                                                   tolerances)
            position += new
            err = float(np.abs(have - want).max())
            report.max_error[key] = max(report.max_error.get(key, 0.0), err)
            if not np.isfinite(have).all():
                report.failures.append(f"{case}_p{position}: {key} has NaN or infinite values")
            elif tolerances is not None and not np.allclose(have, want, atol=tolerances["logits"][0],
                                                         rtol=tolerances["logits"][1]):
                atol, rtol = tolerances["logits"]
                report.failures.append(f"{case}_p{position}: {key} max error {err:.3g} > atol {atol:g} + rtol {rtol:g}")
            if step == 5:  # beams trade places within the batch
                origin = rng.integers(0, rows, rows)
                for s in sessions:
                    s.reorder(origin, cache_only=True)
            if step == 9 and rows > 1:  # a sentence leaves
                for s in sessions:
                    s.reorder(np.arange(1, rows))
                rows -= 1
            if step == 14:  # row 0's sentence is done
                for s in sessions:
                    s.release(np.array([0]))
            if step == 17:  # two sentences join: row 0 again, and a new row
                joining = rng.integers(min(4, c.src_vocab_size - 1), c.src_vocab_size, (2, src_len + 3), dtype=np.int64)
                joining_mask = np.ones_like(joining)
                joining_mask[1, 2:] = 0
                for s in sessions:
                    s.admit(joining, joining_mask, np.array([0, 1]), np.array([0, rows]))
                rows += 1
        report.cases += 1
    return report
