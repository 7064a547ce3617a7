"""One base for every backend's step session (the decoding loop's view of a backend, decoding.StepSession).

`RowSession` holds what all of them share: the busy lock (one decode at a time on a session) and the decoder's
inputs between steps, row by row (twostep.runtime.backends.rows.DecoderRows), through which sentences join,
leave and trade places. A backend implements three things, on its own arrays (numpy, torch, OrtValues):

    encode(input_ids, attention_mask, rows)   the mask and cross K/V of new sentences, under the decoder's input
                                              names (`rows`: how many rows the batch will have, for engines
                                              with a profile)
    empty_cache(batch)                        self-attention caches of no positions (past_len 0)
    run_decoder(input_ids, need_logits)       one step over every row: what the search reads (`search_results`:
                                              the search outputs where the decoder has them, the last position's
                                              float32 logits (B, V) where asked for or where it has none) and the
                                              new caches under their input names

`HostSession` is the default: host arrays, both graphs through Backend.run.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from twostep.artifact.config import ModelConfig
from twostep.artifact.spec import ALIGNMENT, SEARCH_OUTPUTS, GraphSpec, present_name
from twostep.errors import BadInput, SessionBusy
from twostep.runtime.backends.base import NUMPY_DTYPES, Backend, Feeds, check_positions
from twostep.runtime.backends.rows import DecoderRows, NumpyOps

MASK = "encoder_attention_mask"


def search_results(out, need_logits: bool, decoder: GraphSpec, to_host=np.asarray,
                   last=lambda logits: logits[:, -1]) -> dict[str, np.ndarray]:
    """What a step gives the search from a decoder's outputs `out` (a backend's arrays; `to_host` makes one a
    numpy array, `last(logits)` the last position's logits one): its search outputs, if it has them, and the last
    position's float32 logits if `need_logits` or it has none."""
    results = {name: to_host(out[name]) for name in SEARCH_OUTPUTS} if decoder.searches else {}
    if need_logits or not decoder.searches:
        results["logits"] = np.asarray(last(out["logits"]), dtype=np.float32)
    return results


class RowSession:
    """`decoder`: the spec of the decoder graph it runs. `own_cache`: the session keeps the self-attention cache
    itself (the in-place decoder's buffers), so DecoderRows holds only the mask and cross K/V. `max_width`: the
    widest the cache may be before a step (an engine profile's limit)."""

    def __init__(self, config: ModelConfig, decoder: GraphSpec, ops, own_cache: bool = False,
                 max_width: int | None = None):
        self.config, self.decoder = config, decoder
        self.rows = DecoderRows(ops, MASK, [t.name for t in decoder.past_cross],
                                [] if own_cache else [t.name for t in decoder.past_self], max_width)
        self.busy = threading.Lock()
        self.search_width = next((t.shape[1] for t in decoder.outputs if t.name == "top_ids"), 0)

    @contextmanager
    def claimed(self) -> Iterator[None]:
        """A session holds one batch's cache: a second thread decoding on it would mix two batches, so it is
        refused with SessionBusy (a Translator serialises its callers instead)."""
        if not self.busy.acquire(blocking=False):
            raise SessionBusy("this step session is decoding in another thread; use one session per thread, or "
                              "share a Translator, which serialises its callers")
        try:
            yield
        finally:
            self.busy.release()

    # -- what a backend implements -----------------------------------------------------------------
    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray, rows: int) -> dict:
        raise NotImplementedError

    def empty_cache(self, batch: int) -> dict:
        raise NotImplementedError

    def run_decoder(self, input_ids: np.ndarray, need_logits: bool = True) -> tuple[dict, dict]:
        raise NotImplementedError

    # -- the decoding loop's calls (decoding.StepSession) --------------------------------------------
    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> None:
        tensors = self.encode(input_ids, attention_mask, input_ids.shape[0])
        tensors.update(self.empty_cache(input_ids.shape[0]))
        self.rows.start(tensors, attention_mask.sum(1))

    def admit(self, input_ids: np.ndarray, attention_mask: np.ndarray, sources: np.ndarray, rows: np.ndarray) -> None:
        tensors = self.encode(input_ids, attention_mask, max(self.rows.rows, int(rows.max()) + 1))
        self.rows.admit(tensors, attention_mask.sum(1), sources, rows)

    def release(self, rows: np.ndarray) -> None:
        self.rows.release(rows)

    def step(self, input_ids: np.ndarray) -> np.ndarray:
        return self.search_step(input_ids)["logits"]

    def search_step(self, input_ids: np.ndarray, need_logits: bool = True) -> dict[str, np.ndarray]:
        # The inputs were checked when encoded; from here on the session makes them itself, so the per-step
        # check is only the one that can fail: running past the position table.
        check_positions(self.config, self.rows.longest + input_ids.shape[1])
        results, presents = self.run_decoder(input_ids, need_logits)
        self.rows.advance(presents, input_ids.shape[1])
        return results

    def reorder(self, origin: np.ndarray, cache_only: bool = False) -> None:
        self.rows.reorder(origin, cache_only)

    def alignment(self, input_ids: np.ndarray, attention_mask: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """The decoder's alignment (B, T, S) float32 for target tokens (B, T) fed at once from the start on
        sources (B, S): row t is the source attention of the step that predicts the token after targets[:, t].
        Stateless: the running batch's rows stay as they are (the graphs run apart, through the backend)."""
        if ALIGNMENT not in self.decoder.output_names:
            raise BadInput("this model's decoder gives no alignment (replace_unknowns needs a model imported with "
                           "alignment heads: a CTranslate2 model or Argos package)")
        backend, graph = self.backend, self.decoder.name
        enc = backend.run("encoder", {"input_ids": input_ids, "attention_mask": attention_mask})
        batch, new = targets.shape
        feeds = {"input_ids": np.ascontiguousarray(targets, np.int64), MASK: attention_mask,
                 "past_lengths": np.zeros(batch, np.int64),
                 **{t.name: np.zeros(t.concrete(batch=batch, past_len=0, capacity=new), NUMPY_DTYPES[t.dtype])
                    for t in self.decoder.past_self},
                 **{t.name: np.asarray(enc[present_name(t.name)]) for t in self.decoder.past_cross}}
        return np.asarray(backend._run(graph, feeds, [ALIGNMENT])[ALIGNMENT], dtype=np.float32)  # feeds of its spec


class HostSession(RowSession):
    """The decoder's inputs kept as host arrays between steps; both graphs run through the backend."""

    def __init__(self, backend: Backend, decoder: str = "decoder", own_cache: bool = False):
        self.backend = backend
        super().__init__(backend.config, backend.spec(decoder), NumpyOps(), own_cache)
        self.presents = {t.name: present_name(t.name) for t in self.decoder.past_self}  # each step's new past

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray, rows: int) -> Feeds:
        """Host arrays the session may write into."""
        enc = self.backend.run("encoder", {"input_ids": input_ids, "attention_mask": attention_mask})
        return {MASK: np.array(attention_mask), **{t.name: enc[present_name(t.name)] for t in self.decoder.past_cross}}

    def empty_cache(self, batch: int) -> Feeds:
        return {t.name: np.zeros(t.concrete(batch=batch, past_len=0), NUMPY_DTYPES[t.dtype])
                for t in self.decoder.past_self}

    def run_decoder(self, input_ids: np.ndarray, need_logits: bool = True) -> tuple[dict, Feeds]:
        rows, names = self.rows, self.decoder.step_output_names
        if self.decoder.searches and not need_logits:  # the full logits stay in the graph
            names = [name for name in names if name != "logits"]
        out = self.backend._run("decoder", {"input_ids": input_ids, "past_lengths": rows.lengths, **rows.tensors},
                                names)
        presents = {past: out[present] for past, present in self.presents.items()}
        return search_results(out, need_logits, self.decoder), presents
