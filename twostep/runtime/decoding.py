"""Decoding, written once for every backend.

A backend hands the loop a `StepSession`: it runs the encoder once per batch, then one decoder step at a
time, keeping the KV cache wherever it likes (host or device). The loop only ever sees the logits of the
last position and sends back token ids, plus beam origins for beam search.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from twostep.errors import BadInput, SessionBusy


class StepSession(Protocol):
    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> None:
        """Encode a batch (B, S) int64 and reset the self-attention cache to zero length."""

    def step(self, input_ids: np.ndarray) -> np.ndarray:
        """Feed new tokens (B, T) int64; return float32 logits of the last position (B, V)."""

    def reorder(self, origin: np.ndarray, cache_only: bool = False) -> None:
        """Keep batch rows `origin` (B',) of the self-attention cache and, unless `cache_only`, of the cross
        K/V and mask. Beam search expands every row once, then reorders with `cache_only`: beams never leave
        their sentence's block of rows, where cross K/V and mask are the same."""


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad token lists into (B, S) ids and a (B, S) mask (1 keep, 0 pad)."""
    if not sequences or any(len(s) == 0 for s in sequences):
        raise BadInput("empty input: every sentence needs at least one token")
    width = max(len(s) for s in sequences)
    ids = np.full((len(sequences), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(sequences), width), dtype=np.int64)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return ids, mask


@dataclass
class RowControl:
    """What a batching executor adds to a decode. Each sentence has its own max_new_tokens (`limits`, each at
    most the decode's); `on_done(i, result)` is called as soon as sentence i is finished, with what the decode
    returns for it; a sentence for which `cancelled(i)` is true is dropped unanswered. Finished and cancelled
    sentences leave the batch at the next step: their rows of the cache, cross K/V and mask are dropped
    (`session.reorder`), so the rows still decoding neither wait for them nor compute for them."""

    limits: Sequence[int]
    on_done: Callable[[int, object], None]
    cancelled: Callable[[int], bool] = field(default=lambda i: False)

    def leaving(self, live: np.ndarray, done: np.ndarray) -> np.ndarray:
        """Of the sentences `live` (in row order), those that stay: not done, not cancelled."""
        stay = ~done[live]
        stay[stay] = [not self.cancelled(int(i)) for i in live[stay]]
        return stay

    def compact(self, session: StepSession, live: np.ndarray, done: np.ndarray, tokens: np.ndarray):
        """One row per sentence: drop the rows of those that left; (live, tokens) of the rest, None if none stays."""
        stay = self.leaving(live, done)
        if not stay.any():
            return None
        if not stay.all():
            session.reorder(np.flatnonzero(stay))
            live, tokens = live[stay], tokens[stay]
        return live, tokens


def sentence_limits(control: RowControl | None, batch: int, max_new_tokens: int) -> np.ndarray:
    if control is None:
        return np.full(batch, max_new_tokens)
    limits = np.asarray(control.limits, dtype=np.int64)
    if limits.shape != (batch,) or (limits < 1).any() or (limits > max_new_tokens).any():
        raise ValueError(f"limits must be {batch} values in 1..{max_new_tokens}, got {control.limits}")
    return limits


def greedy(
    session: StepSession, sources: Sequence[Sequence[int]], *, bos_id: int, eos_id: int, pad_id: int,
    max_new_tokens: int, suppress_eos: bool = False, control: RowControl | None = None,
) -> list[list[int]]:
    """Batched greedy decoding; each result stops before its eos (or at max_new_tokens)."""
    ids, mask = pad_batch(sources, pad_id)
    session.start(ids, mask)
    batch = len(sources)
    limits = sentence_limits(control, batch, max_new_tokens)
    live = np.arange(batch)  # the sentence each row decodes
    tokens = np.full((batch, 1), bos_id, dtype=np.int64)
    done = np.zeros(batch, dtype=bool)
    out = np.zeros((batch, max_new_tokens), dtype=np.int64)
    lengths = np.full(batch, max_new_tokens)
    for t in range(max_new_tokens):
        logits = session.step(tokens)
        if suppress_eos:
            logits[:, eos_id] = -np.inf
        next_ids = logits.argmax(-1)
        out[live, t] = next_ids
        is_eos = next_ids == eos_id
        ended = ~done[live] & (is_eos | (t + 1 >= limits[live]))
        lengths[live[ended]] = np.where(is_eos[ended], t, t + 1)
        done[live[ended]] = True
        if control is not None:
            for i in live[ended]:
                control.on_done(int(i), out[i, : lengths[i]].tolist())
        if done.all():
            break
        tokens = next_ids[:, None]
        if control is not None:
            kept = control.compact(session, live, done, tokens)
            if kept is None:
                break
            live, tokens = kept
    return [out[b, : lengths[b]].tolist() for b in range(batch)]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def row_log_normalisers(logits: np.ndarray, scratch: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(max, log-sum-exp of logits - max) per row, in float64: log_softmax(x) = (x - max) - lse, rounded as
    `log_softmax(logits.astype(float64))` rounds. `scratch`, a float64 array of the logits' shape, saves an
    allocation per step. Large batches are split in two, the halves computed at once (numpy's ufuncs let go
    of the GIL), while the backend's threads are idle between steps; each row's sum is the same either way."""
    if scratch is None:
        scratch = np.empty(logits.shape, dtype=np.float64)
    if logits.size < PARALLEL_ELEMENTS:
        return _normalisers(logits, scratch)
    half = len(logits) // 2
    other = helper_pool().submit(_normalisers, logits[half:], scratch[half:])
    top, lse = _normalisers(logits[:half], scratch[:half])
    top2, lse2 = other.result()
    return np.concatenate([top, top2]), np.concatenate([lse, lse2])


PARALLEL_ELEMENTS = 1 << 20  # below this, a second thread costs more than it saves
_pool = None


def helper_pool():
    global _pool
    if _pool is None:
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(1, thread_name_prefix="twostep-beam")
    return _pool


def _normalisers(logits: np.ndarray, scratch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    top = logits.max(-1).astype(np.float64)
    shifted = np.subtract(logits, top[:, None], out=scratch, dtype=np.float64)
    np.exp(shifted, out=shifted)
    return top, np.log(shifted.sum(-1))


def row_candidates(logits: np.ndarray, n: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of every entry of `rows` of logits (R, V) that is at least the row's n-th largest:
    the row's n best, with every tie at the n-th. Found through chunk maxima: the n-th largest of the chunks'
    maxima is a lower bound of the n-th largest entry, and only the chunks above it are read again."""
    vocab = logits.shape[1]
    width = -(-vocab // max(4 * n, 64))  # chunk width: at least 4n chunks
    full = vocab // width  # whole chunks; a shorter one may follow
    if full < n or not len(rows):  # few columns: every entry is a candidate
        r, c = np.nonzero(logits[rows] > -np.inf)
        return rows[r], c
    chosen = logits if len(rows) == len(logits) else logits[rows]
    maxima = np.maximum.reduceat(chosen, np.arange(0, vocab, width), axis=1)  # (R', chunks)
    chunks = maxima.shape[1]
    bound = np.partition(maxima, chunks - n, axis=1)[:, chunks - n]
    r, chunk = np.nonzero(maxima >= bound[:, None])
    whole = chunk < full
    blocks = chosen[:, : full * width].reshape(len(chosen), full, width)  # a view: chunks as rows
    values = blocks[r[whole], chunk[whole]]  # (hits, width)
    i, col = np.nonzero((values >= bound[r[whole]][:, None]) & (values > -np.inf))
    out_r, out_c = [r[whole][i]], [chunk[whole][i] * width + col]
    for row in r[~whole]:  # the short last chunk
        tail = chosen[row, full * width :]
        (col,) = np.nonzero((tail >= bound[row]) & (tail > -np.inf))
        out_r.append(np.full(len(col), row)), out_c.append(full * width + col)
    return rows[np.concatenate(out_r)], np.concatenate(out_c)


def beam_candidates(logits: np.ndarray, scores: np.ndarray, n: int, skip_token: int | None = None,
                    scratch: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each sentence's n best continuations. logits (S*K, V), K rows per sentence; scores (S, K), the beams'
    log-probabilities (-inf: not alive). Returns totals (S, n) float64 and flat indices beam * V + token,
    best first, ties to the lower index, padded with -inf and -1 where a sentence has fewer than n finite
    candidates: the prefix of a stable `argsort(-(scores + log_softmax(logits)))` over each sentence's K*V
    candidates that stops at the first -inf. `skip_token` (a suppressed eos) counts in the softmax but is
    never a candidate: it is set to -inf in `logits`, which are the caller's, in place. log-softmax is monotone in each row, so a sentence's n best lie among its rows' n
    best logits: only those get a total."""
    sentences, k = scores.shape
    vocab = logits.shape[1]
    top, lse = row_log_normalisers(logits, scratch)
    if skip_token is not None:
        logits[:, skip_token] = -np.inf
    flat_scores = scores.reshape(-1)
    r, c = row_candidates(logits, n, np.flatnonzero(flat_scores > -np.inf))
    total = flat_scores[r] + ((logits[r, c].astype(np.float64) - top[r]) - lse[r])
    sentence, flat = r // k, (r % k) * vocab + c
    order = np.lexsort((flat, -total, sentence))
    sentence, flat, total = sentence[order], flat[order], total[order]
    rank = np.arange(len(order)) - np.searchsorted(sentence, sentence)
    best = rank < n
    out_total, out_flat = np.full((sentences, n), -np.inf), np.full((sentences, n), -1, dtype=np.int64)
    out_total[sentence[best], rank[best]] = total[best]
    out_flat[sentence[best], rank[best]] = flat[best]
    return out_total, out_flat


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]
    score: float  # sum of log-probs divided by length ** length_penalty


def beam_search(
    session: StepSession, sources: Sequence[Sequence[int]], *, beam_size: int, bos_id: int, eos_id: int,
    pad_id: int, max_new_tokens: int, length_penalty: float = 1.0, n_best: int = 1, suppress_eos: bool = False,
    control: RowControl | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search. Each sentence keeps `beam_size` live hypotheses; the cache rows follow their beam
    of origin (`session.reorder`). A sentence is done once it has `n_best` finished hypotheses and its best
    live one, normalised at the current length, cannot beat the worst of them; at its max_new_tokens its
    live beams count as finished. A step's selection is vectorised over the batch (`beam_candidates`); only
    hypotheses that end in eos are handled one by one."""
    if not 1 <= n_best <= beam_size:
        raise BadInput(f"n_best must be between 1 and the beam size {beam_size}, got {n_best}")
    ids, mask = pad_batch(sources, pad_id)
    session.start(ids, mask)
    batch, k = len(sources), beam_size
    limits = sentence_limits(control, batch, max_new_tokens)
    live = np.arange(batch)  # the sentence each block of k rows decodes
    session.reorder(np.repeat(np.arange(batch), k))  # (B*K) rows, sentence-major
    scores = np.full((batch, k), -np.inf)
    scores[:, 0] = 0.0  # the first step expands one beam only
    history = np.zeros((batch * k, 0), dtype=np.int64)
    tokens = np.full((batch * k, 1), bos_id, dtype=np.int64)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    worst_finished = np.full(batch, -np.inf)  # the score of finished[b][-1] once it holds n_best
    done = np.zeros(batch, dtype=bool)
    scratch = None

    def norm(score, length: int):  # a score, or an array of them
        return score / (max(length, 1) ** length_penalty)

    def keep_best(b: int) -> None:
        finished[b].sort(key=lambda h: -h.score)
        del finished[b][n_best:]
        if len(finished[b]) == n_best:
            worst_finished[b] = finished[b][-1].score

    def finish_live_beams(j: int, b: int) -> None:  # at max_new_tokens: live beams count as finished
        for beam in range(k):
            if scores[j, beam] > -np.inf:
                finished[b].append(Hypothesis(history[j * k + beam].tolist(), norm(scores[j, beam], history.shape[1])))
        keep_best(b)
        done[b] = True

    for t in range(max_new_tokens):
        logits = session.step(tokens)  # (n*K, V), n = len(live)
        n = len(live)
        if scratch is None or scratch.shape[0] < logits.shape[0]:
            scratch = np.empty(logits.shape, dtype=np.float64)
        deciding = ~done[live]
        alive = np.where(deciding[:, None], scores, -np.inf)
        total, flat = beam_candidates(logits, alive, 2 * k, eos_id if suppress_eos else None,
                                      scratch[: logits.shape[0]])
        beam, token = np.divmod(flat, logits.shape[1])
        # Walk each sentence's candidates best first: an eos finishes a hypothesis, any other token continues
        # one, until k continue; the walk stops at the first -inf.
        valid = total > -np.inf
        is_eos = valid & (token == eos_id)
        going_on = valid & ~is_eos
        walked = valid & (np.cumsum(going_on, axis=1) - going_on < k)
        kept = going_on & walked
        j, c = np.nonzero(kept)
        slot = (np.cumsum(kept, axis=1) - 1)[j, c]
        next_scores = np.full((n, k), -np.inf)
        next_tokens = np.full((n, k), pad_id, dtype=np.int64)
        origins = np.tile(np.arange(k), (n, 1))
        next_scores[j, slot], next_tokens[j, slot], origins[j, slot] = total[j, c], token[j, c], beam[j, c]
        ending = is_eos & walked
        for j, c in zip(*np.nonzero(ending)):
            finished[live[j]].append(Hypothesis(history[j * k + beam[j, c]].tolist(), norm(float(total[j, c]), t + 1)))
        for j in np.flatnonzero(ending.any(axis=1)):
            keep_best(live[j])
        best_alive = norm(next_scores[:, 0], t + 1)
        ends = deciding & (~kept.any(axis=1) | (worst_finished[live] >= best_alive))
        done[live[ends]] = True
        ended = list(live[ends])
        if not done.all():
            rows = (np.arange(n)[:, None] * k + origins).reshape(-1)
            history = np.concatenate([history[rows], next_tokens.reshape(-1, 1)], axis=1)
            scores, tokens = next_scores, next_tokens.reshape(-1, 1)
            for j in np.flatnonzero(~done[live] & (t + 1 >= limits[live])):
                finish_live_beams(j, live[j])
                ended.append(live[j])
        if control is not None:
            for b in ended:
                control.on_done(int(b), finished[b])
        if done.all():
            break
        stay = control.leaving(live, done) if control is not None else np.ones(n, dtype=bool)
        if stay.all():
            session.reorder(rows, cache_only=True)  # origins stay within each sentence's block of k rows
        elif stay.any():  # sentences leave: drop their blocks, cross K/V and mask too
            blocks = np.repeat(stay, k)
            session.reorder(rows[blocks])
            live, history, tokens, scores = live[stay], history[blocks], tokens[blocks], scores[stay]
        else:
            live = live[stay]
            break
    for j, b in enumerate(live):  # no steps at all (max_new_tokens 0): live beams count as finished
        if not done[b]:
            finish_live_beams(j, b)
            if control is not None:
                control.on_done(int(b), finished[b])
    return finished


def sample(
    session: StepSession, sources: Sequence[Sequence[int]], *, bos_id: int, eos_id: int, pad_id: int,
    max_new_tokens: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
    control: RowControl | None = None,
) -> list[list[int]]:
    """Batched sampling with temperature, top-k and nucleus (top-p) filtering. With a `seed` each sentence
    draws from its own generator, seeded by the seed and the sentence's token ids: the same sentence and seed
    give the same sample whatever else shares the batch."""
    if temperature <= 0:
        raise BadInput(f"temperature must be positive, got {temperature}")
    if not 0 < top_p <= 1:
        raise BadInput(f"top_p must be in (0, 1], got {top_p}")
    rngs = [np.random.default_rng(None if seed is None else [seed, len(s), *map(int, s)]) for s in sources]
    ids, mask = pad_batch(sources, pad_id)
    session.start(ids, mask)
    batch = len(sources)
    limits = sentence_limits(control, batch, max_new_tokens)
    live = np.arange(batch)  # the sentence each row decodes
    tokens = np.full((batch, 1), bos_id, dtype=np.int64)
    done = np.zeros(batch, dtype=bool)
    out: list[list[int]] = [[] for _ in range(batch)]
    for t in range(max_new_tokens):
        logits = session.step(tokens).astype(np.float64) / temperature
        if top_k > 0:
            kth = np.sort(logits, axis=-1)[:, -min(top_k, logits.shape[-1])][:, None]
            logits = np.where(logits < kth, -np.inf, logits)
        probs = np.exp(log_softmax(logits))
        if top_p < 1.0:
            order = np.argsort(-probs, axis=-1, kind="stable")
            sorted_probs = np.take_along_axis(probs, order, -1)
            keep_sorted = np.cumsum(sorted_probs, -1) - sorted_probs < top_p  # the smallest set reaching top_p
            keep = np.zeros_like(keep_sorted)
            np.put_along_axis(keep, order, keep_sorted, -1)
            probs = np.where(keep, probs, 0.0)
            probs /= probs.sum(-1, keepdims=True)
        next_ids = np.array([rngs[b].choice(probs.shape[-1], p=p) for b, p in zip(live, probs)], dtype=np.int64)
        for row, b in enumerate(live):
            if done[b]:
                continue
            if next_ids[row] != eos_id:
                out[b].append(int(next_ids[row]))
            if next_ids[row] == eos_id or t + 1 >= limits[b]:
                done[b] = True
                if control is not None:
                    control.on_done(int(b), out[b])
        if done.all():
            break
        tokens = next_ids[:, None]
        if control is not None:
            kept = control.compact(session, live, done, tokens)
            if kept is None:
                break
            live, tokens = kept
    return out


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode; impossible combinations are refused here, with one BadInput listing them all."""

    beam_size: int = 1
    length_penalty: float = 1.0
    n_best: int = 1
    sampling: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_new_tokens: int | None = None  # None: 2 * source length + 16; always capped by max_positions
    suppress_eos: bool = False

    def __post_init__(self) -> None:
        problems = []
        if not is_int(self.beam_size) or self.beam_size < 1:
            problems.append(f"beam size must be an integer >= 1, got {self.beam_size!r}")
        elif not is_int(self.n_best) or not 1 <= self.n_best <= self.beam_size:
            problems.append(f"n_best must be between 1 and the beam size {self.beam_size}, got {self.n_best!r}")
        if self.sampling and is_int(self.beam_size) and self.beam_size > 1:
            problems.append("sampling and beam search exclude each other: choose one")
        for name in ("length_penalty", "temperature", "top_p"):
            if not is_number(getattr(self, name)):
                problems.append(f"{name} must be a finite number, got {getattr(self, name)!r}")
        if is_number(self.temperature) and self.temperature <= 0:
            problems.append(f"temperature must be positive, got {self.temperature}")
        if is_number(self.top_p) and not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if not is_int(self.top_k) or self.top_k < 0:
            problems.append(f"top_k must be an integer >= 0 (0: off), got {self.top_k!r}")
        if self.seed is not None and (not is_int(self.seed) or self.seed < 0):
            problems.append(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.max_new_tokens is not None and (not is_int(self.max_new_tokens) or self.max_new_tokens < 1):
            problems.append(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if problems:
            raise BadInput("bad decoding options: " + "; ".join(problems))


def is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool) and math.isfinite(value)


_busy: weakref.WeakSet = weakref.WeakSet()  # sessions decoding right now
_busy_lock = threading.Lock()


@contextmanager
def exclusive(session: StepSession) -> Iterator[None]:
    """A step session holds one batch's cache: a second thread decoding on it would mix two batches, so it
    is refused with SessionBusy (a Translator serialises its callers instead)."""
    with _busy_lock:
        if session in _busy:
            raise SessionBusy("this step session is decoding in another thread; use one session per thread, or "
                              "share a Translator, which serialises its callers")
        _busy.add(session)
    try:
        yield
    finally:
        with _busy_lock:
            _busy.discard(session)


def decode(session: StepSession, sources: Sequence[Sequence[int]], options: DecodeOptions, *, bos_id: int,
           eos_id: int, pad_id: int, max_new_tokens: int, control: RowControl | None = None) -> list[list[Hypothesis]]:
    """One entry point for every strategy; greedy and sampling give one hypothesis with score 0. One decode
    at a time per session (SessionBusy otherwise). `control`: see RowControl; its on_done gets hypotheses."""
    common = dict(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, max_new_tokens=max_new_tokens)
    single = control
    if control is not None:  # greedy and sampling report token lists: hand on_done hypotheses
        single = RowControl(control.limits, lambda i, tokens: control.on_done(i, [Hypothesis(tokens, 0.0)]),
                            control.cancelled)
    with exclusive(session):
        if options.sampling:
            outs = sample(session, sources, temperature=options.temperature, top_k=options.top_k,
                          top_p=options.top_p, seed=options.seed, control=single, **common)
            return [[Hypothesis(o, 0.0)] for o in outs]
        if options.beam_size > 1:
            return beam_search(session, sources, beam_size=options.beam_size,
                               length_penalty=options.length_penalty, n_best=options.n_best,
                               suppress_eos=options.suppress_eos, control=control, **common)
        outs = greedy(session, sources, suppress_eos=options.suppress_eos, control=single, **common)
        return [[Hypothesis(o, 0.0)] for o in outs]
