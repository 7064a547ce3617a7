"""Decoding, written once for every backend.

A backend hands the loop a `StepSession`: it encodes sentences, then runs one decoder step at a time for
every row of its batch, keeping the decoder's inputs wherever it likes (host or device). The loop only ever
sees the logits of the last position and sends back token ids, beam origins for beam search, and which rows
sentences take and leave.

A `RunningBatch` decodes sentences together, each with its own options and its own limit: sentences join
at any step boundary (their encoder runs alone, their rows start with an empty history next to rows that are
further on) and leave at the step they are done, so one batch can run for as long as sentences keep coming
(the serving executor's in-flight batching). Each strategy is a `Group` of the batch's sentences decoded with
one DecodeOptions: `Greedy`, `Sampling`, `Beam`. Every row is computed as if its sentence were alone, so what
a sentence decodes does not depend on which sentences share its batch, or when it joined. `decode` is the
static case: every sentence joins at the first step.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from twostep.errors import BadInput, SessionBusy


class StepSession(Protocol):
    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> None:
        """Encode a batch (B, S) int64 into rows 0..B-1, each with an empty history; earlier rows are gone."""

    def admit(self, input_ids: np.ndarray, attention_mask: np.ndarray, sources: np.ndarray,
              rows: np.ndarray) -> None:
        """Encode sentences (M, S) into the running batch: row rows[i] takes sentence sources[i] with an empty
        history, a free row or the next new one at the end. The other rows go on as they are."""

    def release(self, rows: np.ndarray) -> None:
        """Rows whose sentence left: their logits mean nothing until `admit` gives them another."""

    def step(self, input_ids: np.ndarray) -> np.ndarray:
        """Feed new tokens (B, T) int64, every row (free ones too); return float32 logits of the last position
        (B, V)."""

    def reorder(self, origin: np.ndarray, cache_only: bool = False) -> None:
        """Keep batch rows `origin` (B',) of the self-attention cache and, unless `cache_only`, of the cross
        K/V and mask. Beam search reorders with `cache_only` while no sentence leaves: beams never leave their
        sentence's rows, whose cross K/V and mask are the same."""


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


def rows_of(logits: np.ndarray, at: np.ndarray) -> np.ndarray:
    """logits[at]: a view where the rows are one run (the common case), else a copy."""
    if len(at) and at[-1] - at[0] == len(at) - 1 and (len(at) < 3 or (np.diff(at) == 1).all()):
        return logits[at[0] : at[-1] + 1]
    return logits[at]


class Group:
    """The sentences of a running batch decoded with one DecodeOptions, `k` rows each: sentence j owns the
    batch rows at[j * k : (j + 1) * k]. Per sentence: `steps` tokens generated so far, at most `limits`."""

    k = 1

    def __init__(self, options: DecodeOptions, bos_id: int, eos_id: int, pad_id: int):
        self.options, self.bos_id, self.eos_id, self.pad_id = options, bos_id, eos_id, pad_id
        self.owners: list = []
        self.at = np.zeros(0, np.int64)
        self.steps = np.zeros(0, np.int64)
        self.limits = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.owners)

    def join(self, sources: list[list[int]], limits: list[int], owners: list, rows: np.ndarray) -> None:
        self.owners += owners
        self.at = np.concatenate([self.at, rows])
        self.steps = np.concatenate([self.steps, np.zeros(len(owners), np.int64)])
        self.limits = np.concatenate([self.limits, np.asarray(limits, np.int64)])
        self.joined(sources)

    def leave(self, stay: np.ndarray) -> np.ndarray:
        """Keep the sentences `stay` (a mask); returns the rows of those that left."""
        blocks = self.at.reshape(-1, self.k)
        freed, self.at = blocks[~stay].reshape(-1), blocks[stay].reshape(-1)
        self.owners = [o for o, keep in zip(self.owners, stay) if keep]
        self.steps, self.limits = self.steps[stay], self.limits[stay]
        self.kept(stay)
        return freed

    def joined(self, sources: list[list[int]]) -> None:
        """New sentences were appended: extend the strategy's own state."""

    def kept(self, stay: np.ndarray) -> None:
        """Sentences left: keep the strategy's state of the others."""

    def advance(self, logits: np.ndarray) -> tuple[dict[int, list[Hypothesis]], np.ndarray, np.ndarray | None]:
        """One step, given the whole batch's logits (R, V). Returns the sentences done now (index -> their
        hypotheses), the next token of each of this group's rows, and for beam search each row's row of
        origin (an index into this group's rows), else None."""
        raise NotImplementedError


class Greedy(Group):
    """The most likely token; a sentence ends at eos (not output) or at its limit."""

    def __init__(self, *args):
        super().__init__(*args)
        self.out = np.zeros((0, 0), np.int64)  # each sentence's tokens so far, steps[j] of them

    def joined(self, sources: list[list[int]]) -> None:
        width = max(self.out.shape[1], int(self.limits.max()))
        out = np.zeros((len(self), width), np.int64)
        out[: len(self.out), : self.out.shape[1]] = self.out
        self.out = out

    def kept(self, stay: np.ndarray) -> None:
        self.out = self.out[stay]

    def pick(self, logits: np.ndarray) -> np.ndarray:
        return logits.argmax(-1)

    def advance(self, logits: np.ndarray) -> tuple[dict[int, list[Hypothesis]], np.ndarray, None]:
        logits = rows_of(logits, self.at)
        if self.options.suppress_eos:
            logits[:, self.eos_id] = -np.inf
        next_ids = self.pick(logits)
        self.out[np.arange(len(self)), self.steps] = next_ids
        self.steps += 1
        is_eos = next_ids == self.eos_id
        length = self.steps - is_eos
        done = {int(j): [Hypothesis(self.out[j, : length[j]].tolist(), 0.0)]
                for j in np.flatnonzero(is_eos | (self.steps >= self.limits))}
        return done, next_ids, None


class Sampling(Greedy):
    """Temperature, top-k and nucleus (top-p) filtering. With a seed each sentence draws from its own
    generator, seeded by the seed and its token ids: the same sentence and seed give the same sample whatever
    shares the batch, and whenever it joined."""

    def __init__(self, *args):
        super().__init__(*args)
        self.rngs: list[np.random.Generator] = []

    def joined(self, sources: list[list[int]]) -> None:
        super().joined(sources)
        seed = self.options.seed
        self.rngs += [np.random.default_rng(None if seed is None else [seed, len(s), *map(int, s)]) for s in sources]

    def kept(self, stay: np.ndarray) -> None:
        super().kept(stay)
        self.rngs = [r for r, keep in zip(self.rngs, stay) if keep]

    def pick(self, logits: np.ndarray) -> np.ndarray:
        o = self.options
        logits = logits.astype(np.float64) / o.temperature
        if o.top_k > 0:
            kth = np.sort(logits, axis=-1)[:, -min(o.top_k, logits.shape[-1])][:, None]
            logits = np.where(logits < kth, -np.inf, logits)
        probs = np.exp(log_softmax(logits))
        if o.top_p < 1.0:
            order = np.argsort(-probs, axis=-1, kind="stable")
            sorted_probs = np.take_along_axis(probs, order, -1)
            keep_sorted = np.cumsum(sorted_probs, -1) - sorted_probs < o.top_p  # the smallest set reaching top_p
            keep = np.zeros_like(keep_sorted)
            np.put_along_axis(keep, order, keep_sorted, -1)
            probs = np.where(keep, probs, 0.0)
            probs /= probs.sum(-1, keepdims=True)
        return np.array([rng.choice(probs.shape[-1], p=p) for rng, p in zip(self.rngs, probs)], dtype=np.int64)


class Beam(Group):
    """Each sentence keeps `beam_size` live hypotheses in its k rows; the cache rows follow their beam of
    origin. A sentence is done once it has `n_best` finished hypotheses and its best live one, normalised at
    its current length, cannot beat the worst of them; at its limit its live beams count as finished. A
    step's selection is vectorised over the group (`beam_candidates`); only hypotheses that end in eos are
    handled one by one."""

    def __init__(self, *args):
        super().__init__(*args)
        o = self.options
        self.k, self.n_best, self.length_penalty = o.beam_size, o.n_best, o.length_penalty
        self.scores = np.zeros((0, self.k))  # each beam's log-probability; -inf: not alive
        self.history = np.zeros((0, 0), np.int64)  # each row's tokens, steps[j] of them
        self.finished: list[list[Hypothesis]] = []
        self.worst = np.zeros(0)  # the score of finished[j][-1] once it holds n_best
        self.scratch = None
        self.powers: dict[int, float] = {}

    def power(self, length: int) -> float:
        """length ** length_penalty as the scalar rule computes it (so array and scalar scores agree bit for bit)."""
        if length not in self.powers:
            self.powers[length] = max(length, 1) ** self.length_penalty
        return self.powers[length]

    def norm(self, score, length: int):
        return score / self.power(length)

    def joined(self, sources: list[list[int]]) -> None:
        m, k = len(sources), self.k
        scores = np.full((m, k), -np.inf)
        scores[:, 0] = 0.0  # the first step expands one beam only
        self.scores = np.concatenate([self.scores, scores])
        width = max(self.history.shape[1], int(self.limits.max()))
        history = np.zeros((len(self) * k, width), np.int64)
        history[: len(self.history), : self.history.shape[1]] = self.history
        self.history = history
        self.finished += [[] for _ in range(m)]
        self.worst = np.concatenate([self.worst, np.full(m, -np.inf)])

    def kept(self, stay: np.ndarray) -> None:
        self.scores, self.worst = self.scores[stay], self.worst[stay]
        self.history = self.history[np.repeat(stay, self.k)]
        self.finished = [f for f, keep in zip(self.finished, stay) if keep]

    def keep_best(self, j: int) -> None:
        self.finished[j].sort(key=lambda h: -h.score)
        del self.finished[j][self.n_best :]
        if len(self.finished[j]) == self.n_best:
            self.worst[j] = self.finished[j][-1].score

    def advance(self, logits: np.ndarray) -> tuple[dict[int, list[Hypothesis]], np.ndarray, np.ndarray]:
        logits = rows_of(logits, self.at)  # (n*K, V)
        n, k, vocab = len(self), self.k, logits.shape[1]
        if self.scratch is None or self.scratch.shape[0] < logits.shape[0]:
            self.scratch = np.empty(logits.shape, dtype=np.float64)
        total, flat = beam_candidates(logits, self.scores, 2 * k, self.eos_id if self.options.suppress_eos else None,
                                      self.scratch[: logits.shape[0]])
        beam, token = np.divmod(flat, vocab)
        # Walk each sentence's candidates best first: an eos finishes a hypothesis, any other token continues
        # one, until k continue; the walk stops at the first -inf.
        valid = total > -np.inf
        is_eos = valid & (token == self.eos_id)
        going_on = valid & ~is_eos
        walked = valid & (np.cumsum(going_on, axis=1) - going_on < k)
        kept = going_on & walked
        j, c = np.nonzero(kept)
        slot = (np.cumsum(kept, axis=1) - 1)[j, c]
        next_scores = np.full((n, k), -np.inf)
        next_tokens = np.full((n, k), self.pad_id, dtype=np.int64)
        origins = np.tile(np.arange(k), (n, 1))
        next_scores[j, slot], next_tokens[j, slot], origins[j, slot] = total[j, c], token[j, c], beam[j, c]
        length = self.steps + 1
        ending = is_eos & walked
        for j, c in zip(*np.nonzero(ending)):
            tokens = self.history[j * k + beam[j, c], : self.steps[j]].tolist()
            self.finished[j].append(Hypothesis(tokens, self.norm(float(total[j, c]), int(length[j]))))
        for j in np.flatnonzero(ending.any(axis=1)):
            self.keep_best(j)
        best_alive = next_scores[:, 0] / np.array([self.power(int(x)) for x in length])
        ends = ~kept.any(axis=1) | (self.worst >= best_alive)
        rows = (np.arange(n)[:, None] * k + origins).reshape(-1)
        self.history = self.history[rows]
        self.history[np.arange(n * k), np.repeat(self.steps, k)] = next_tokens.reshape(-1)
        self.scores, self.steps = next_scores, length
        done = {int(j): self.finished[j] for j in np.flatnonzero(ends)}
        for j in np.flatnonzero(~ends & (self.steps >= self.limits)):  # live beams count as finished
            for b in range(k):
                if self.scores[j, b] > -np.inf:
                    tokens = self.history[j * k + b, : self.steps[j]].tolist()
                    self.finished[j].append(Hypothesis(tokens, self.norm(self.scores[j, b], int(self.steps[j]))))
            self.keep_best(j)
            done[int(j)] = self.finished[j]
        return done, next_tokens.reshape(-1), rows


def strategy(options: DecodeOptions) -> type[Group]:
    return Sampling if options.sampling else Beam if options.beam_size > 1 else Greedy


@dataclass(frozen=True)
class Entry:
    """A sentence joining a running batch: its source ids, options, max_new_tokens (`limit`) and an `owner`
    that step() hands back with its hypotheses. `group` overrides the strategy options imply (beam search
    with one beam)."""

    source: Sequence[int]
    options: DecodeOptions
    limit: int
    owner: object
    group: type[Group] | None = None


class RunningBatch:
    """Sentences decoding together on one step session, each with its own options and limit. `add` lets
    sentences join between steps: one encoder run for all of them, each takes a free row (or new rows at the
    end, k for a beam), starting from bos. `step` runs one decoder step for every row and returns the sentences
    that are done; their rows are released then, and rows whose `cancelled(owner)` is true too, unanswered.
    Rows left free are filled by the next sentences that join; once more than `compact_at` of the batch's rows
    are free, the rest are moved together (the only time rows that stay are copied)."""

    def __init__(self, session: StepSession, *, bos_id: int, eos_id: int, pad_id: int,
                 cancelled: Callable[[object], bool] | None = None, compact_at: float = 0.25):
        self.session, self.bos_id, self.eos_id, self.pad_id = session, bos_id, eos_id, pad_id
        self.cancelled, self.compact_at = cancelled, compact_at
        self.groups: dict[tuple, Group] = {}
        self.tokens = np.zeros(0, np.int64)  # each row's next token
        self.free: list[int] = []
        self.rows = 0

    @property
    def sentences(self) -> int:
        return sum(len(g) for g in self.groups.values())

    @property
    def live_rows(self) -> int:
        return self.rows - len(self.free)

    def owners(self) -> list:
        return [owner for g in self.groups.values() for owner in g.owners]

    def add(self, entries: Sequence[Entry]) -> list[tuple[object, list[Hypothesis]]]:
        """Sentences join; those with a limit of 0 are done at once (returned). If the session refuses them
        (an exception from its encoder), the batch is as it was."""
        done = [(e.owner, [Hypothesis([], 0.0)]) for e in entries if e.limit < 1]
        entries = [e for e in entries if e.limit >= 1]
        if not entries:
            return done
        ids, mask = pad_batch([e.source for e in entries], self.pad_id)
        keys = [(e.group or strategy(e.options), e.options) for e in entries]
        counts = np.array([e.options.beam_size if cls is Beam else 1 for e, (cls, _) in zip(entries, keys)])
        needed = int(counts.sum())
        free = sorted(self.free)
        rows = np.array(free[:needed] + list(range(self.rows, self.rows + max(needed - len(free), 0))), np.int64)
        sources = np.repeat(np.arange(len(entries)), counts)
        if self.rows == 0:
            self.session.start(ids, mask)
            if needed != len(entries):
                self.session.reorder(sources)  # k rows a beam sentence, sentence by sentence
        else:
            self.session.admit(ids, mask, sources, rows)
        self.free = free[needed:]
        self.rows = max(self.rows, int(rows.max()) + 1)
        self.tokens = np.concatenate([self.tokens, np.zeros(self.rows - len(self.tokens), np.int64)])
        self.tokens[rows] = self.bos_id
        first = np.concatenate([[0], np.cumsum(counts)])
        joining: dict[tuple, list[int]] = {}
        for i, key in enumerate(keys):
            joining.setdefault(key, []).append(i)
        for (cls, options), mine in joining.items():
            if (cls, options) not in self.groups:
                self.groups[cls, options] = cls(options, self.bos_id, self.eos_id, self.pad_id)
            self.groups[cls, options].join(
                [list(entries[i].source) for i in mine], [entries[i].limit for i in mine],
                [entries[i].owner for i in mine], np.concatenate([rows[first[i] : first[i + 1]] for i in mine]))
        return done

    def step(self) -> list[tuple[object, list[Hypothesis]]]:
        """One decoder step for every row; the sentences done at it, with their hypotheses."""
        logits = self.session.step(self.tokens[:, None])
        finished, freed = [], []
        origin = None
        for key, g in list(self.groups.items()):
            done, tokens, local_origin = g.advance(logits)
            self.tokens[g.at] = tokens
            stay = np.ones(len(g), dtype=bool)
            for j, hyps in done.items():
                stay[j] = False
                finished.append((g.owners[j], hyps))
            if self.cancelled is not None:
                for j in np.flatnonzero(stay):
                    stay[j] = not self.cancelled(g.owners[j])
            if local_origin is not None:
                moving = np.repeat(stay, g.k) & (local_origin != np.arange(len(g.at)))
                if moving.any():
                    if origin is None:
                        origin = np.arange(self.rows)
                    origin[g.at[moving]] = g.at[local_origin[moving]]
            if not stay.all():
                freed.append(g.leave(stay))
            if not len(g):
                del self.groups[key]
        if origin is not None:
            self.session.reorder(origin, cache_only=True)  # beams trade places within their sentence
        if freed:
            rows = np.concatenate(freed)
            self.session.release(rows)
            self.free += rows.tolist()
            self.compact()
        return finished

    def compact(self) -> None:
        """Once more than compact_at of the rows are free, move the others together (group by group)."""
        if not self.groups:
            self.rows, self.free, self.tokens = 0, [], np.zeros(0, np.int64)  # the next add starts afresh
            return
        if len(self.free) <= self.compact_at * self.rows:
            return
        origin = np.concatenate([g.at for g in self.groups.values()])
        self.session.reorder(origin)
        offset = 0
        for g in self.groups.values():
            g.at = np.arange(offset, offset + len(g.at))
            offset += len(g.at)
        self.tokens, self.rows, self.free = self.tokens[origin], len(origin), []


def decode(session: StepSession, sources: Sequence[Sequence[int]], options: DecodeOptions, *, bos_id: int,
           eos_id: int, pad_id: int, max_new_tokens: int, limits: Sequence[int] | None = None,
           group: type[Group] | None = None) -> list[list[Hypothesis]]:
    """Every sentence decoded together, start to end: n-best hypotheses each (greedy and sampling give one
    with score 0). `limits`: each sentence's max_new_tokens (default: all max_new_tokens). One decode at a
    time per session (SessionBusy otherwise)."""
    if not sources:
        raise BadInput("empty input: every sentence needs at least one token")
    limits = [max_new_tokens] * len(sources) if limits is None else list(limits)
    results: list[list[Hypothesis]] = [[] for _ in sources]
    with exclusive(session):
        batch = RunningBatch(session, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
        finished = batch.add([Entry(s, options, limit, i, group) for i, (s, limit) in enumerate(zip(sources, limits))])
        while True:
            for i, hyps in finished:
                results[i] = hyps
            if not batch.sentences:
                return results
            finished = batch.step()


def greedy(session: StepSession, sources: Sequence[Sequence[int]], *, bos_id: int, eos_id: int, pad_id: int,
           max_new_tokens: int, suppress_eos: bool = False) -> list[list[int]]:
    """Batched greedy decoding; each result stops before its eos (or at max_new_tokens)."""
    hyps = decode(session, sources, DecodeOptions(suppress_eos=suppress_eos), bos_id=bos_id, eos_id=eos_id,
                  pad_id=pad_id, max_new_tokens=max_new_tokens)
    return [h[0].tokens for h in hyps]


def beam_search(session: StepSession, sources: Sequence[Sequence[int]], *, beam_size: int, bos_id: int,
                eos_id: int, pad_id: int, max_new_tokens: int, length_penalty: float = 1.0, n_best: int = 1,
                suppress_eos: bool = False) -> list[list[Hypothesis]]:
    """Batched beam search (see Beam); with beam_size 1 too (scored, where greedy is not)."""
    if not 1 <= n_best <= beam_size:
        raise BadInput(f"n_best must be between 1 and the beam size {beam_size}, got {n_best}")
    options = DecodeOptions(beam_size=beam_size, length_penalty=length_penalty, n_best=n_best,
                            suppress_eos=suppress_eos)
    return decode(session, sources, options, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
                  max_new_tokens=max_new_tokens, group=Beam)


def sample(session: StepSession, sources: Sequence[Sequence[int]], *, bos_id: int, eos_id: int, pad_id: int,
           max_new_tokens: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           seed: int | None = None) -> list[list[int]]:
    """Batched sampling (see Sampling)."""
    if temperature <= 0:
        raise BadInput(f"temperature must be positive, got {temperature}")
    if not 0 < top_p <= 1:
        raise BadInput(f"top_p must be in (0, 1], got {top_p}")
    options = DecodeOptions(sampling=True, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    hyps = decode(session, sources, options, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
                  max_new_tokens=max_new_tokens)
    return [h[0].tokens for h in hyps]
