"""One backend interface: load, run, close; a context manager; input checks done once, here.

A backend runs the two graphs by name on named numpy tensors. `session()` gives the decoding loop a
`StepSession`; the default one below keeps the decoder's inputs as host arrays (twostep.runtime.backends.rows),
and a backend that can keep them on its device (ort-cuda, trt) overrides it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from twostep.errors import BadInput
from twostep.exporter.spec import GraphSpec, present_name
from twostep.model.config import ModelConfig
from twostep.runtime.backends.rows import DecoderRows, NumpyOps

Feeds = dict[str, np.ndarray]

NUMPY_DTYPES = {"int64": np.int64, "float32": np.float32, "float16": np.float16}


class Backend(ABC):
    name: str = "?"
    precision: str = "fp32"  # what it computes in: sets verify's tolerances (fp32, tf32, fp16, int8)
    inplace: bool = False  # decodes with the artifact's in-place decoder (ort-cpu, twostep.exporter.inplace)
    runs_inplace: bool = False  # would decode with the in-place decoder where the artifact has one

    def __init__(self, config: ModelConfig, graphs: dict[str, GraphSpec]):
        self.config, self.graphs = config, graphs
        self.loaded = False

    # -- lifecycle -----------------------------------------------------------------------------
    def load(self) -> "Backend":
        if not self.loaded:
            self._load()
            self.loaded = True
        return self

    def close(self) -> None:
        if self.loaded:
            self._close()
            self.loaded = False

    def __enter__(self) -> "Backend":
        return self.load()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def target_positions(self) -> int:
        """Target positions a decode can reach: max_positions, or less where an engine profile says so."""
        return self.config.max_positions

    # -- running -------------------------------------------------------------------------------
    def run(self, graph: str, feeds: Feeds) -> Feeds:
        """Run one graph; feeds and results are keyed by the spec's tensor names."""
        self.check_inputs(graph, feeds)
        return self._run(graph, feeds)

    def check_inputs(self, graph: str, feeds: Feeds) -> None:
        spec = self.graphs[graph]
        expected = spec.input_names
        if sorted(feeds) != sorted(expected):
            missing, extra = sorted(set(expected) - set(feeds)), sorted(set(feeds) - set(expected))
            raise BadInput(f"{graph}: inputs missing {missing}, unexpected {extra}")
        sizes: dict[str, int] = {}
        for t in spec.inputs:
            array = feeds[t.name]
            if array.dtype != NUMPY_DTYPES[t.dtype]:
                raise BadInput(f"{graph}.{t.name}: dtype {array.dtype}, expected {t.dtype}")
            if array.ndim != len(t.shape):
                raise BadInput(f"{graph}.{t.name}: rank {array.ndim}, expected {len(t.shape)} {list(t.shape)}")
            for axis, (dim, size) in enumerate(zip(t.shape, array.shape)):
                if isinstance(dim, int) and dim != size:
                    raise BadInput(f"{graph}.{t.name}: axis {axis} is {size}, expected {dim}")
                if isinstance(dim, str) and sizes.setdefault(dim, size) != size:
                    raise BadInput(f"{graph}.{t.name}: axis {axis} ({dim}) is {size}, other inputs say {sizes[dim]}")
        lengths = feeds.get("past_lengths")
        if lengths is not None and lengths.size:  # each row's history: at most the cache's width
            past = sizes.get("past_len", sizes.get("capacity", 0))
            if lengths.min() < 0 or lengths.max() > past:
                raise BadInput(f"{graph}.past_lengths: each row's history must be 0..{past} positions (the "
                               f"cache's width), got {lengths.min()}..{lengths.max()}")
            check_positions(self.config, int(lengths.max()) + sizes.get("new_len", 0))
        if sizes.get("src_len", 0) > self.config.max_positions:
            raise BadInput(f"{graph}: source of {sizes['src_len']} tokens, the model takes at most "
                           f"{self.config.max_positions} (max_positions)")
        ids = feeds["input_ids"]
        vocab = self.config.src_vocab_size if graph == "encoder" else self.config.tgt_vocab_size
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            raise BadInput(f"{graph}.input_ids: token ids outside the vocabulary [0, {vocab})")

    def session(self) -> "HostSession":
        return HostSession(self)

    @abstractmethod
    def _load(self) -> None: ...

    @abstractmethod
    def _run(self, graph: str, feeds: Feeds) -> Feeds: ...

    def _close(self) -> None:
        pass


class HostSession:
    """The decoding loop's view of a backend, with the decoder's inputs kept as host arrays between steps:
    rows join, leave and trade places without moving the others (DecoderRows)."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.decoder = backend.graphs["decoder"]
        self.rows = DecoderRows(NumpyOps(), "encoder_attention_mask", [t.name for t in self.decoder.past_cross],
                                [t.name for t in self.decoder.past_self])
        self.presents = {t.name: present_name(t.name) for t in self.decoder.past_self}  # each step's new past

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> Feeds:
        return encode_sources(self.backend, self.decoder, input_ids, attention_mask)

    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> None:
        tensors = self.encode(input_ids, attention_mask)
        for t in self.decoder.past_self:
            tensors[t.name] = np.zeros(t.concrete(batch=input_ids.shape[0], past_len=0), NUMPY_DTYPES[t.dtype])
        self.rows.start(tensors, attention_mask.sum(1))

    def admit(self, input_ids: np.ndarray, attention_mask: np.ndarray, sources: np.ndarray, rows: np.ndarray) -> None:
        self.rows.admit(self.encode(input_ids, attention_mask), attention_mask.sum(1), sources, rows)

    def release(self, rows: np.ndarray) -> None:
        self.rows.release(rows)

    def step(self, input_ids: np.ndarray) -> np.ndarray:
        # The inputs were checked when encoded; from here on the session makes them itself, so the per-step
        # check is only the one that can fail: running past the position table.
        rows = self.rows
        check_positions(self.backend.config, rows.longest + input_ids.shape[1])
        out = self.backend._run("decoder", {"input_ids": input_ids, "past_lengths": rows.lengths, **rows.tensors})
        rows.advance({past: out[present] for past, present in self.presents.items()}, input_ids.shape[1])
        return np.asarray(out["logits"][:, -1], dtype=np.float32)

    def reorder(self, origin: np.ndarray, cache_only: bool = False) -> None:
        self.rows.reorder(origin, cache_only)


def encode_sources(backend: Backend, decoder, input_ids: np.ndarray, attention_mask: np.ndarray) -> Feeds:
    """The mask and cross K/V that `decoder` (a graph spec) takes for a batch of sources, from the backend's
    encoder: host arrays the session may write into."""
    enc = backend.run("encoder", {"input_ids": input_ids, "attention_mask": attention_mask})
    out = {"encoder_attention_mask": np.array(attention_mask)}
    out.update({t.name: enc[present_name(t.name)] for t in decoder.past_cross})
    return out


def check_positions(config: ModelConfig, positions: int) -> None:
    if positions > config.max_positions:
        raise BadInput(f"decoding past max_positions {config.max_positions}: {positions} target positions")
