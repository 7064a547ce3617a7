"""The decoder's inputs between steps, row by row, for step sessions whose rows come and go.

A running batch holds sentences at different positions (schema 2 decoders take `past_lengths`):

    encoder_attention_mask [rows, src_len], past_*_cross_{i} [rows, heads, src_len, head_dim]
        right-padded to the longest source of the batch: written once, when a sentence takes its row
    past_*_self_{i} [rows, heads, past_len, head_dim]
        left-padded: row r's history is its last lengths[r] columns (the graph masks the columns before)

A sentence that joins takes a free row (`admit`: its mask and cross K/V are written there, its history is
empty, whatever the row held before is masked) or a new row at the end; a sentence that leaves frees its row
(`release`: its length stays 0, so it holds no position back); beam search moves rows (`reorder`). Nothing
else is copied: the rows that stay are never moved to make room, and the cache's leading columns, which no
row needs once the oldest sentence left, are cut once they are an eighth of it (or the cache reaches its
allowed width): the plain decoder copies its whole cache every step, so a cut pays for itself within
eight steps (docs/benchmarks.md: cutting at a half left in-flight decoding 1.3x wider and 12% slower).

`DecoderRows` keeps this bookkeeping on the host (lengths, free rows, source lengths) and does the array work
through an `ArrayOps`: numpy (ort-cpu), torch (the eager reference, trt) or ONNX Runtime graphs on a device
(ort-cuda).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class NumpyOps:
    """Host arrays."""

    def shape(self, x) -> tuple[int, ...]:
        return x.shape

    def take(self, x, rows: np.ndarray | None, axis: int, start: int, stop: int):
        """x[rows] (all rows if None) with `axis` cut to start:stop: a new contiguous array."""
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, stop)
        if rows is None:
            return np.ascontiguousarray(x[tuple(index)])
        index[0] = rows
        return np.ascontiguousarray(x[tuple(index)])

    def pad(self, x, axis: int, before: int, after: int):
        """Zeros added along `axis`."""
        shape = list(x.shape)
        shape[axis] += before + after
        out = np.zeros(shape, x.dtype)
        index = [slice(None)] * x.ndim
        index[axis] = slice(before, before + x.shape[axis])
        out[tuple(index)] = x
        return out

    def put(self, x, rows: np.ndarray, y):
        """x with rows `rows` replaced by y, in place."""
        x[rows] = y
        return x


class TorchOps:
    """torch tensors, on any device."""

    def __init__(self, torch):
        self.torch = torch

    def shape(self, x) -> tuple[int, ...]:
        return tuple(x.shape)

    def index(self, rows: np.ndarray, x):
        return self.torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(x.device)

    def take(self, x, rows, axis: int, start: int, stop: int):
        if rows is not None:
            x = x.index_select(0, self.index(rows, x))
        return x.narrow(axis, start, stop - start).contiguous()

    def pad(self, x, axis: int, before: int, after: int):
        widths = [0, 0] * (x.dim() - 1 - axis) + [before, after]
        return self.torch.nn.functional.pad(x, widths)

    def put(self, x, rows: np.ndarray, y):
        x[self.index(rows, x)] = y
        return x


class DecoderRows:
    """The mask, cross K/V and (unless the session keeps its own) self-attention cache of a running batch,
    with each row's history length, source length and whether it is free. `max_width`: the widest the
    self-attention cache may be before a step (an engine profile's limit)."""

    def __init__(self, ops, mask_name: str, cross_names: Iterable[str], self_names: Iterable[str] = (),
                 max_width: int | None = None):
        self.ops, self.mask_name = ops, mask_name
        self.cross_names, self.self_names = list(cross_names), list(self_names)
        self.max_width = max_width
        self.tensors: dict = {}
        self.lengths = np.zeros(0, np.int64)  # each row's history
        self.sources = np.zeros(0, np.int64)  # each row's source length
        self.free = np.zeros(0, bool)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def longest(self) -> int:
        return int(self.lengths.max()) if self.rows else 0

    @property
    def past_len(self) -> int:
        return self.ops.shape(self.tensors[self.self_names[0]])[2] if self.self_names else 0

    def axis(self, name: str) -> int:
        """The source or position axis of a tensor."""
        return 1 if name == self.mask_name else 2

    def start(self, tensors: dict, source_lengths: np.ndarray) -> None:
        """A new batch: mask, cross K/V and empty caches (past_len 0) of every row."""
        self.tensors = dict(tensors)
        rows = len(source_lengths)
        self.lengths, self.free = np.zeros(rows, np.int64), np.zeros(rows, bool)
        self.sources = np.asarray(source_lengths, np.int64).copy()

    def admit(self, new: dict, source_lengths: np.ndarray, sources: np.ndarray, rows: np.ndarray) -> None:
        """`new`: the mask and cross K/V of m encoded sentences; batch row rows[i] takes sentence sources[i] with
        an empty history. Rows at and past the end extend the batch."""
        ops, t = self.ops, self.tensors
        old_width, new_width = ops.shape(t[self.mask_name])[1], ops.shape(new[self.mask_name])[1]
        width = max(old_width, new_width)
        grow = max(int(rows.max()) + 1 - self.rows, 0)
        for name in (self.mask_name, *self.cross_names):
            axis, current = self.axis(name), t[name]
            if width > old_width:
                current = ops.pad(current, axis, 0, width - old_width)
            if grow:
                current = ops.pad(current, 0, 0, grow)
            joining = ops.take(new[name], sources, axis, 0, new_width)
            if width > new_width:
                joining = ops.pad(joining, axis, 0, width - new_width)
            t[name] = ops.put(current, rows, joining)
        if grow:
            for name in self.self_names:
                t[name] = ops.pad(t[name], 0, 0, grow)
            self.lengths = np.concatenate([self.lengths, np.zeros(grow, np.int64)])
            self.sources = np.concatenate([self.sources, np.zeros(grow, np.int64)])
            self.free = np.concatenate([self.free, np.zeros(grow, bool)])
        self.lengths[rows] = 0
        self.sources[rows] = np.asarray(source_lengths)[sources]
        self.free[rows] = False

    def release(self, rows: np.ndarray) -> None:
        self.free[rows] = True
        self.lengths[rows] = 0
        self.sources[rows] = 0
        self.fit()

    def advance(self, presents: dict, new_len: int) -> None:
        """After a step: the new caches; every row in use is new_len positions further."""
        self.tensors.update(presents)
        self.lengths[~self.free] += new_len
        self.fit()

    def fit(self) -> None:
        """Cut the columns no row needs: the self cache's leading ones once they are an eighth of it (or it
        reaches max_width), the sources' trailing ones once they are half."""
        if self.self_names:
            width, longest = self.past_len, self.longest
            waste = width - longest
            if waste and (8 * waste >= width or (self.max_width is not None and width >= self.max_width)):
                for name in self.self_names:
                    self.tensors[name] = self.ops.take(self.tensors[name], None, 2, waste, width)
        width = self.ops.shape(self.tensors[self.mask_name])[1]
        longest = max(int(self.sources.max()) if self.rows else 0, 1)
        if 2 * longest <= width:  # a long source left: the others no longer pay for its columns
            for name in (self.mask_name, *self.cross_names):
                self.tensors[name] = self.ops.take(self.tensors[name], None, self.axis(name), 0, longest)

    def reorder(self, origin: np.ndarray, cache_only: bool = False) -> None:
        """Keep rows `origin`, in that order: of the self-attention cache only (beams trading places within
        a sentence, whose mask and cross K/V rows are equal), or of everything, each cut to what its rows need."""
        ops, t = self.ops, self.tensors
        lengths = self.lengths[origin]
        width = self.past_len
        cut = 0 if cache_only else width - (int(lengths.max()) if len(lengths) else 0)
        for name in self.self_names:
            t[name] = ops.take(t[name], origin, 2, cut, width)
        if not cache_only:
            sources = self.sources[origin]
            longest = max(int(sources.max()) if len(sources) else 0, 1)
            for name in (self.mask_name, *self.cross_names):
                t[name] = ops.take(t[name], origin, self.axis(name), 0, longest)
            self.sources = sources
        self.lengths, self.free = lengths, self.free[origin]


__all__ = ["DecoderRows", "NumpyOps", "TorchOps"]
