"""ort-cpu's step session over an in-place decoder (twostep.exporter.inplace: the contrib one or the standard).

The self-attention cache is one host buffer per layer and kind, (rows, heads, capacity, head_dim), bound
with IO binding as both the past input and the present output, so ONNX Runtime writes each step's K/V into
it: nothing is concatenated or handed back. Row r's history is its first lengths[r] positions
(`past_lengths`), so rows at different positions share a step: a sentence that joins a running batch takes a
free row (its length 0) or a new one, and one that leaves frees its row; nothing else moves. The capacity
doubles when a decode outgrows it. Beam search's reorder moves, in place, only the rows whose beam of origin
is another row, and only their filled positions; mask and cross K/V (the RowSession's rows) are written row
by row as sentences join. Logits and the search outputs land in buffers reused across steps (the logits' is
where the generator's product writes anyway), and one IO binding serves every step until a buffer changes: a
step binds only its token ids and lengths.
"""

from __future__ import annotations

import numpy as np

from twostep.artifact.spec import INPLACE, SEARCH_OUTPUTS, present_name
from twostep.errors import BadInput
from twostep.runtime.backends.base import NUMPY_DTYPES
from twostep.runtime.backends.ortlib import import_ort
from twostep.runtime.backends.session import HostSession, search_results

FIRST_CAPACITY = 32


class InplaceSession(HostSession):
    """The encoder runs as for the plain decoder (HostSession); the decoder's cache is this session's own."""

    def __init__(self, backend):
        super().__init__(backend, backend.decoder, own_cache=True)
        self.ort = import_ort()
        self.session = backend.sessions[backend.decoder]
        self.one_token = backend.decoder == INPLACE  # GroupQueryAttention's CPU kernel: one new token on a past
        self.self_names = [t.name for t in self.decoder.past_self]
        self.dtype = NUMPY_DTYPES[self.decoder.past_self[0].dtype]
        self.capacity = 0
        self.cache: dict[str, np.ndarray] = {}
        self.logits = None
        self.outputs: dict[str, np.ndarray] = {}  # the search outputs' buffers
        self.binding = None  # bound to mask, cross K/V, cache and logits; None once one of them is a new array
        self.bound_tensors: list = []  # the mask and cross K/V arrays it is bound to (rows.fit may replace them)

    def empty_cache(self, batch: int) -> dict:
        """None in the rows: the buffers are the session's, made anew at the first capacity."""
        self.cache, self.capacity = {}, 0
        return {}

    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> None:
        super().start(input_ids, attention_mask)
        self.reserve(FIRST_CAPACITY)

    def admit(self, input_ids: np.ndarray, attention_mask: np.ndarray, sources: np.ndarray, rows: np.ndarray) -> None:
        before = self.rows.rows
        super().admit(input_ids, attention_mask, sources, rows)
        if self.rows.rows > before:  # new rows at the end: their cache is never read before it is written
            for name in self.self_names:
                grown = np.zeros((self.rows.rows, *self.cache[name].shape[1:]), self.dtype)
                grown[:before, :, : self.rows.longest] = self.cache[name][:, :, : self.rows.longest]
                self.cache[name] = grown
        self.binding = None

    def reserve(self, positions: int) -> None:
        """Capacity for `positions`: doubled (up to max_positions), the filled part copied over."""
        if positions <= self.capacity:
            return
        capacity = min(max(positions, 2 * self.capacity, FIRST_CAPACITY), self.backend.config.max_positions)
        filled = self.rows.longest
        for t in self.decoder.past_self:
            grown = np.zeros(t.concrete(batch=self.rows.rows, capacity=capacity), self.dtype)
            if t.name in self.cache:
                grown[:, :, :filled] = self.cache[t.name][:, :, :filled]
            self.cache[t.name] = grown
        self.capacity = capacity
        self.binding = None

    def bound(self):
        """The binding of everything but token ids and lengths (OrtValues over the arrays, no copies), made
        again after an array was replaced."""
        tensors = list(self.rows.tensors.values())
        if self.binding is None or any(a is not b for a, b in zip(tensors, self.bound_tensors)):
            self.bound_tensors = tensors
            over = self.ort.OrtValue.ortvalue_from_numpy
            binding = self.session.io_binding()
            for name, array in self.rows.tensors.items():
                binding.bind_ortvalue_input(name, over(array))
            binding.bind_ortvalue_output("logits", over(self.logits))
            for name, array in self.outputs.items():
                binding.bind_ortvalue_output(name, over(array))
            for name in self.self_names:
                value = over(self.cache[name])
                binding.bind_ortvalue_input(name, value)
                binding.bind_ortvalue_output(present_name(name), value)
            self.binding = binding
        return self.binding

    def run_decoder(self, input_ids: np.ndarray, need_logits: bool = True) -> tuple[dict, dict]:
        new, longest, rows = input_ids.shape[1], self.rows.longest, self.rows.rows
        if self.one_token and new > 1 and longest > 0 and rows > 1:
            raise BadInput("the in-place decoder takes one new token per step once the cache holds a past "
                           "(ONNX Runtime's GroupQueryAttention); feed tokens one at a time or use kv_cache='concat'")
        self.reserve(longest + new)
        shape = (rows, new, self.backend.config.tgt_vocab_size)
        if self.logits is None or self.logits.shape != shape:
            self.logits = np.empty(shape, self.dtype)
            specs = {t.name: t for t in self.decoder.outputs if t.name in SEARCH_OUTPUTS}
            self.outputs = {name: np.empty(t.concrete(batch=rows), NUMPY_DTYPES[t.dtype]) for name, t in specs.items()}
            self.binding = None
        binding = self.bound()
        # held until the next step: ONNX Runtime may read them in place
        self.feeds = np.ascontiguousarray(input_ids), self.rows.lengths.copy()
        binding.bind_cpu_input("input_ids", self.feeds[0])
        binding.bind_cpu_input("past_lengths", self.feeds[1])
        self.session.run_with_iobinding(binding)
        return search_results({"logits": self.logits, **self.outputs}, need_logits, self.decoder), {}

    def reorder(self, origin: np.ndarray, cache_only: bool = False) -> None:
        origin = np.asarray(origin)
        rows = self.rows.rows
        if len(origin) == rows:  # in place: only rows that take another row's cache, only their filled part
            moved = np.flatnonzero(origin != np.arange(rows))
            if len(moved):
                filled = int(self.rows.lengths[origin[moved]].max())
                for name in self.self_names:
                    buffer = self.cache[name]
                    buffer[moved, :, :filled] = buffer[origin[moved], :, :filled]
        else:  # rows leave or the batch expands: new buffers of the new row count
            filled = int(self.rows.lengths[origin].max()) if len(origin) else 0
            for name in self.self_names:
                buffer = np.zeros((len(origin), *self.cache[name].shape[1:]), self.dtype)
                buffer[:, :, :filled] = self.cache[name][origin, :, :filled]
                self.cache[name] = buffer
        super().reorder(origin, cache_only)
        if not cache_only or len(origin) != rows:
            self.binding = None
