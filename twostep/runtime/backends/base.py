"""One backend interface: load, run, close; a context manager; input checks done once, here.

A backend runs the two graphs by name on named numpy tensors. `session()` gives the decoding loop a step
session (twostep.runtime.backends.session) over the decoder the backend chose: the plain one, or a variant of
the artifact that it runs (ort-cpu's in-place decoder).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from twostep.artifact.config import ModelConfig
from twostep.artifact.spec import GraphSpec
from twostep.errors import BadInput

Feeds = dict[str, np.ndarray]

NUMPY_DTYPES = {"int64": np.int64, "float32": np.float32, "float16": np.float16}


class Backend(ABC):
    name: str = "?"
    precision: str = "fp32"  # what it computes in: sets verify's tolerances (fp32, tf32, fp16, int8)
    decoder: str = "decoder"  # the graph its sessions decode with: the plain decoder or a variant it runs

    def __init__(self, config: ModelConfig, graphs: dict[str, GraphSpec]):
        self.config, self.graphs = config, graphs
        self.loaded = False

    # -- lifecycle -----------------------------------------------------------------------------
    def load(self) -> Backend:
        if not self.loaded:
            self._load()
            self.loaded = True
        return self

    def close(self) -> None:
        if self.loaded:
            self._close()
            self.loaded = False

    def __enter__(self) -> Backend:
        return self.load()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def target_positions(self) -> int:
        """Target positions a decode can reach: max_positions, or less where an engine profile says so."""
        return self.config.max_positions

    # -- running -------------------------------------------------------------------------------
    def run(self, graph: str, feeds: Feeds, outputs: list[str] | None = None) -> Feeds:
        """Run one graph; feeds and results are keyed by the spec's tensor names. `outputs`: the ones wanted
        (default all); a backend may return more."""
        self.check_inputs(graph, feeds)
        return self._run(graph, feeds, outputs)

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

    def spec(self, graph: str) -> GraphSpec:
        """A graph's I/O: one of the two, or (a backend that runs one) a variant of the artifact."""
        return self.graphs[graph]

    def session(self):
        """A step session (twostep.runtime.backends.session.RowSession) over the decoder it chose."""
        raise NotImplementedError

    def inflight_advice(self) -> str | None:
        """What a server that batches in flight should tell its operator about this backend's decoder, or None."""
        return None

    @abstractmethod
    def _load(self) -> None: ...

    @abstractmethod
    def _run(self, graph: str, feeds: Feeds, outputs: list[str] | None = None) -> Feeds: ...

    def _close(self) -> None:  # noqa: B027 (optional: most backends have nothing to release)
        pass


def check_positions(config: ModelConfig, positions: int) -> None:
    if positions > config.max_positions:
        raise BadInput(f"decoding past max_positions {config.max_positions}: {positions} target positions")
