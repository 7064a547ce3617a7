"""ort-cpu's step session over the in-place decoder (twostep.exporter.inplace).

The self-attention cache is one host buffer per layer and kind, (rows, heads, capacity, head_dim), bound
with IO binding as both the past input and the present output, so ONNX Runtime writes each step's K/V into
it: nothing is concatenated or handed back. The capacity doubles when a decode outgrows it. Beam search's
reorder moves, in place, only the rows whose beam of origin is another row, and only their filled
positions; cross K/V and the mask are bound once per batch. Logits land in a buffer reused across steps,
and one IO binding serves every step until a buffer changes: a step binds only its token ids and lengths.
"""

from __future__ import annotations

import numpy as np

from twostep.errors import BadInput
from twostep.exporter.spec import INPLACE, present_name
from twostep.runtime.backends.base import NUMPY_DTYPES, check_positions

FIRST_CAPACITY = 32


class InplaceSession:
    def __init__(self, backend):
        from twostep.runtime.backends.ort import import_ort

        self.ort = import_ort()
        self.backend = backend
        self.session = backend.sessions[INPLACE]
        self.spec = backend.artifact.variants[INPLACE]
        self.self_names = [t.name for t in self.spec.past_self]
        self.dtype = NUMPY_DTYPES[self.spec.past_self[0].dtype]
        self.rows = self.position = self.capacity = 0
        self.fixed: dict[str, np.ndarray] = {}  # mask and cross K/V, fixed for a batch
        self.cache: dict[str, np.ndarray] = {}
        self.logits = None
        self.binding = None  # bound to fixed, cache and logits; None once one of them is a new array

    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> None:
        enc = self.backend.run("encoder", {"input_ids": input_ids, "attention_mask": attention_mask})
        self.fixed = {"encoder_attention_mask": np.ascontiguousarray(attention_mask)}
        self.fixed.update({t.name: enc[present_name(t.name)] for t in self.spec.past_cross})
        self.rows, self.position, self.capacity = input_ids.shape[0], 0, 0
        self.cache = {}
        self.reserve(FIRST_CAPACITY)
        self.binding = None

    def reserve(self, positions: int) -> None:
        """Capacity for `positions`: doubled (up to max_positions), the filled part copied over."""
        if positions <= self.capacity:
            return
        capacity = min(max(positions, 2 * self.capacity, FIRST_CAPACITY), self.backend.config.max_positions)
        for t in self.spec.past_self:
            grown = np.zeros(t.concrete(batch=self.rows, capacity=capacity), self.dtype)
            if t.name in self.cache:
                grown[:, :, : self.position] = self.cache[t.name][:, :, : self.position]
            self.cache[t.name] = grown
        self.capacity = capacity
        self.binding = None

    def bound(self):
        """The binding of everything but token ids and lengths (OrtValues over the arrays, no copies), made
        again after an array was replaced."""
        if self.binding is None:
            over = self.ort.OrtValue.ortvalue_from_numpy
            binding = self.session.io_binding()
            for name, array in self.fixed.items():
                binding.bind_ortvalue_input(name, over(array))
            binding.bind_ortvalue_output("logits", over(self.logits))
            for name in self.self_names:
                value = over(self.cache[name])
                binding.bind_ortvalue_input(name, value)
                binding.bind_ortvalue_output(present_name(name), value)
            self.binding = binding
        return self.binding

    def step(self, input_ids: np.ndarray) -> np.ndarray:
        new = input_ids.shape[1]
        check_positions(self.backend.config, self.position + new)
        if new > 1 and self.position > 0 and self.rows > 1:
            raise BadInput("the in-place decoder takes one new token per step once the cache holds a past "
                           "(ONNX Runtime's GroupQueryAttention); feed tokens one at a time or use kv_cache='concat'")
        self.reserve(self.position + new)
        shape = (self.rows, new, self.backend.config.tgt_vocab_size)
        if self.logits is None or self.logits.shape != shape:
            self.logits = np.empty(shape, self.dtype)
            self.binding = None
        binding = self.bound()
        # held until the next step: ONNX Runtime may read them in place
        self.feeds = np.ascontiguousarray(input_ids), np.full(self.rows, self.position, dtype=np.int64)
        binding.bind_cpu_input("input_ids", self.feeds[0])
        binding.bind_cpu_input("past_lengths", self.feeds[1])
        self.session.run_with_iobinding(binding)
        self.position += new
        return np.asarray(self.logits[:, -1], dtype=np.float32)

    def reorder(self, origin: np.ndarray, cache_only: bool = False) -> None:
        origin = np.asarray(origin)
        if len(origin) == self.rows:  # in place: only rows that take another row's cache
            moved = np.flatnonzero(origin != np.arange(self.rows))
            if len(moved):
                for name in self.self_names:
                    buffer = self.cache[name]
                    buffer[moved, :, : self.position] = buffer[origin[moved], :, : self.position]
        else:  # rows leave or the batch expands: new buffers of the new row count
            for name in self.self_names:
                buffer = np.zeros((len(origin), *self.cache[name].shape[1:]), self.dtype)
                buffer[:, :, : self.position] = self.cache[name][origin, :, : self.position]
                self.cache[name] = buffer
        if not cache_only:
            self.fixed = {name: np.ascontiguousarray(a[origin]) for name, a in self.fixed.items()}
        if not cache_only or len(origin) != self.rows:
            self.rows = len(origin)
            self.binding = None
