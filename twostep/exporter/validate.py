"""Validation: the graphs against their declaration, then values against eager PyTorch in fp32 on a grid of
shapes different from the trace shapes, with a per-output tolerance table. Every failure is reported at once.
"""

from __future__ import annotations

import hashlib
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

# (atol, rtol) per output kind and weight precision; "logits" and "kv" (every K/V tensor), held as TOLERANCE_RULE
# says (tolerance_failure). int8 has none: its errors are reported, and what it must pass is token agreement with fp32
# eager (twostep verify).
TOLERANCES = {
    "fp32": {"logits": (1e-4, 1e-4), "kv": (1e-4, 1e-4)},
    "tf32": {"logits": (2e-2, 2e-2), "kv": (1e-2, 1e-2)},  # fp32 graphs on TF32 tensor cores (opt-in, ort-trt)
    "fp16": {"logits": (5e-2, 5e-2), "kv": (2e-2, 2e-2)},
    "int8": None,
    "int4": None,
}
TOLERANCE_RULE = "|candidate - reference| <= atol * max(1, rms of the reference's row) + rtol * |reference|"
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

    def check(self, case: str, key: str, have: np.ndarray, want: np.ndarray,
              tolerance: tuple[float, float] | None) -> None:
        """One output against the reference's: its max error kept under `key`; a failure where it is not finite
        or, given a tolerance (atol, rtol), beyond it (tolerance_failure)."""
        err = float(np.abs(have - want).max()) if want.size else 0.0
        self.max_error[key] = max(self.max_error.get(key, 0.0), err)
        if not np.isfinite(have).all():
            self.failures.append(f"{case}: {key} has NaN or infinite values")
        elif tolerance is not None and (failure := tolerance_failure(have, want, tolerance)):
            self.failures.append(f"{case}: {key} {failure}")


def row_scale(reference: np.ndarray) -> np.ndarray:
    """max(1, the root mean square of each row of `reference`, its last axis), that axis kept as 1: (..., 1).

    A row (a position's logits over the vocabulary, one head's key or value at a position) is one vector through one
    matrix, z = W h. fp32 rounding reaches it as a small relative error e of h, which W carries into every element
    of the row alike: |W dh| is about e * rms(z), whatever the element's own size, so a logit near zero (by
    cancellation) has its row's error, not one of its own size. rtol * |value| cannot cover that, and a fixed atol
    refuses correct graphs whose rows are large (transformers' T5 init gives logit rows of rms sqrt(d_model)): the
    absolute tolerance is per unit of the row's rms. It is the reference's rms, so that a wrong candidate cannot
    widen its own tolerance, and it is never below 1, so that rows of unit scale or less keep the fixed atol."""
    reference = reference.astype(np.float64, copy=False)
    if reference.shape[-1] == 0:
        return np.ones((*reference.shape[:-1], 1))
    return np.maximum(1.0, np.sqrt(np.mean(np.square(reference), axis=-1, keepdims=True)))


def tolerance_failure(have: np.ndarray, want: np.ndarray, tolerance: tuple[float, float],
                      scale: np.ndarray | None = None) -> str | None:
    """None where every element of `have` is within `tolerance` (atol, rtol) of the reference's `want` as
    TOLERANCE_RULE says, `scale` being the rows' (row_scale(want) unless given: search outputs take their logits');
    else the largest error, and the element furthest beyond what it may have."""
    atol, rtol = tolerance
    want = want.astype(np.float64)
    err = np.abs(have.astype(np.float64) - want)
    scale = np.broadcast_to(row_scale(want) if scale is None else scale, want.shape)
    allowed = atol * scale + rtol * np.abs(want)
    if not want.size or (err <= allowed).all():
        return None
    worst = np.unravel_index(np.argmax(np.where(np.isnan(err), np.inf, err - allowed)), want.shape)
    return (f"max error {err.max():.3g}; {err[worst]:.3g} where {allowed[worst]:.3g} is allowed (atol {atol:g} x "
            f"row scale {scale[worst]:.3g} + rtol {rtol:g} x |{want[worst]:.3g}|)")


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
            report.check(case, key, have, want, tolerances and tolerances["logits" if name == "logits" else "kv"])
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
    logits' tolerance, scaled by the logits' rows (ids of logits closer than that may trade places)."""
    if tolerances is None:
        return []
    logits = logits.astype(np.float64)
    ids, top = got["top_ids"], got["top_logits"].astype(np.float64)
    failures = []
    if ids.shape != top.shape or ids.shape[0] != logits.shape[0]:
        return [f"{case}: {graph} search outputs have shapes {ids.shape} and {top.shape} for {logits.shape[0]} rows"]
    width, scale = ids.shape[1], row_scale(logits)  # (B, 1): log_norm's error is its row's too
    want_top = -np.sort(-logits, axis=1)[:, :width]
    if (ids < 0).any() or (ids >= logits.shape[1]).any() or tolerance_failure(
            top, np.take_along_axis(logits, ids, 1), tolerances["logits"], scale):
        failures.append(f"{case}: {graph}.top_ids are not the ids of top_logits")
    if tolerance_failure(top, want_top, tolerances["logits"], scale):
        failures.append(f"{case}: {graph}.top_logits are not the {width} largest logits")
    want_norm = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1))
    if tolerance_failure(got["log_norm"], want_norm, tolerances["logits"], scale[:, 0]):
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
            report.check(f"{case}_p{position}", key, have, want, tolerances and tolerances["logits"])
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


class Recorded(Backend):
    """A reference's answers kept on disk, so that validation can compare a candidate with a model no longer in
    memory (export: the eager model's weights and the ONNX graphs' each take the model's size; at 3B, one of
    them fits the machine). Wrapping the reference (`live`), it answers each call from the reference and keeps
    the answer in `directory`; without it (`Recorded(None, directory, config, graphs)`, after the reference is
    gone), from what was kept. A call is known by its graph and inputs; a session's step by every call made on
    that session before it. A call that was not recorded is a bug in the order of the calls: KeyError."""

    decoder = "decoder"

    def __init__(self, live: Backend | None, directory: Path, config=None, graphs=None):
        super().__init__(live.config if live else config, live.graphs if live else graphs)
        self.live, self.directory = live, Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _load(self) -> None:
        pass

    def _run(self, graph: str, feeds, outputs=None):
        digest = hashlib.sha256(graph.encode())
        for name in sorted(feeds):
            digest.update(name.encode() + str(feeds[name].shape).encode() + np.ascontiguousarray(feeds[name]).tobytes())
        return self.answer(digest.hexdigest(), lambda: self.live.run(graph, feeds))

    def answer(self, key: str, compute) -> dict[str, np.ndarray]:
        file = self.directory / f"{key}.npz"
        if file.is_file():
            with np.load(file) as kept:
                return dict(kept)
        if self.live is None:
            raise KeyError(f"no recorded answer {key}: the calls differ from the recording's")
        result = compute()
        np.savez(file, **result)
        return result

    def session(self) -> RecordedSession:
        return RecordedSession(self)


class RecordedSession:
    """A session of Recorded: each call is folded into a running digest; a step answers by it."""

    def __init__(self, owner: Recorded):
        self.owner = owner
        self.live = owner.live.session() if owner.live is not None else None
        self.digest = hashlib.sha256(b"session")

    def fold(self, call: str, *arrays) -> None:
        self.digest.update(call.encode())
        for array in arrays:
            array = np.asarray(array)
            self.digest.update(str(array.shape).encode() + np.ascontiguousarray(array).tobytes())

    def start(self, input_ids, attention_mask) -> None:
        self.fold("start", input_ids, attention_mask)
        if self.live is not None:
            self.live.start(input_ids, attention_mask)

    def admit(self, input_ids, attention_mask, sources, rows) -> None:
        self.fold("admit", input_ids, attention_mask, sources, rows)
        if self.live is not None:
            self.live.admit(input_ids, attention_mask, sources, rows)

    def release(self, rows) -> None:
        self.fold("release", rows)
        if self.live is not None:
            self.live.release(rows)

    def reorder(self, origin, cache_only: bool = False) -> None:
        self.fold("reorder", origin, np.array(cache_only))
        if self.live is not None:
            self.live.reorder(origin, cache_only)

    def step(self, input_ids) -> np.ndarray:
        self.fold("step", input_ids)
        key = self.digest.copy().hexdigest()
        return self.owner.answer(key, lambda: {"logits": self.live.step(input_ids)})["logits"]

    def search_step(self, input_ids, need_logits: bool = True) -> dict[str, np.ndarray]:
        return {"logits": self.step(input_ids)}


class Blank:
    """The candidate of a recording run (record): the recording's answers for the graphs, zeros for a session's
    steps (what it answers is not looked at)."""

    decoder = "recording"

    def __init__(self, recording: Recorded):
        self.recording, self.graphs = recording, recording.graphs

    def run(self, graph: str, feeds, outputs=None):
        return self.recording.run(graph, feeds, outputs)

    def session(self) -> Blank:
        return self

    def start(self, *args, **kwargs) -> None:
        pass

    admit = release = reorder = start

    def search_step(self, input_ids, need_logits: bool = True) -> dict[str, np.ndarray]:
        return {"logits": np.zeros((input_ids.shape[0], self.recording.config.tgt_vocab_size), np.float32)}


def record(reference: Backend, directory: Path, grid: Grid = EXPORT_GRID) -> Recorded:
    """Run `reference` on every call that compare_backend and compare_sessions make of a reference on `grid`,
    keeping its answers in `directory` (the comparisons themselves make the calls, against a Blank candidate);
    returns the recording, to be replayed with Recorded(None, ...) once the reference is gone."""
    recording = Recorded(reference, directory)
    compare_graphs(Blank(recording), recording, "fp32", grid)
    compare_sessions(Blank(recording), recording, "fp32", grid=grid)
    return recording
