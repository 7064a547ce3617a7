"""The beam search that twostep shipped until the step was vectorised (issue 12): one sentence at a time,
in Python, over a float64 log-softmax of every row. Kept verbatim as the oracle that the vectorised beam search
(twostep.runtime.decoding.search.Beam, through tests/search.py's `beam_search`) must reproduce exactly: the same
hypotheses and bit-identical scores."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from twostep.errors import BadInput
from twostep.runtime.decoding import Hypothesis, StepSession, pad_batch


# What a batching executor added to a decode, as the loop had it then (the running batch replaced it).
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


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def top_candidates(scores: np.ndarray, n: int) -> np.ndarray:
    """Indices of the n best scores, best first, ties to the lower index: `argsort(-scores, stable)[:n]`
    without sorting the whole row (a beam's row holds beam_size x vocab candidates)."""
    n = min(n, scores.size)
    threshold = scores[np.argpartition(-scores, n - 1)[:n]].min()
    candidates = np.flatnonzero(scores >= threshold)  # every tie at the threshold, so the order is exact
    return candidates[np.lexsort((candidates, -scores[candidates]))][:n]


def beam_search(
    session: StepSession, sources: Sequence[Sequence[int]], *, beam_size: int, bos_id: int, eos_id: int,
    pad_id: int, max_new_tokens: int, length_penalty: float = 1.0, n_best: int = 1, suppress_eos: bool = False,
    control: RowControl | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search. Each sentence keeps `beam_size` live hypotheses; the cache rows follow their beam
    of origin (`session.reorder`). A sentence is done once it has `n_best` finished hypotheses and its best
    live one, normalised at the current length, cannot beat the worst of them; at its max_new_tokens its
    live beams count as finished."""
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
    done = np.zeros(batch, dtype=bool)

    def norm(score: float, length: int) -> float:
        return score / (max(length, 1) ** length_penalty)

    def finish_live_beams(j: int, b: int) -> None:  # at max_new_tokens: live beams count as finished
        for beam in range(k):
            if scores[j, beam] > -np.inf:
                finished[b].append(Hypothesis(history[j * k + beam].tolist(), norm(scores[j, beam], history.shape[1])))
        finished[b].sort(key=lambda h: -h.score)
        del finished[b][n_best:]
        done[b] = True

    for t in range(max_new_tokens):
        logp = log_softmax(session.step(tokens).astype(np.float64))  # (n*K, V), n = len(live)
        if suppress_eos:
            logp[:, eos_id] = -np.inf
        vocab, n = logp.shape[-1], len(live)
        total = (scores[:, :, None] + logp.reshape(n, k, vocab)).reshape(n, k * vocab)
        next_scores = np.full((n, k), -np.inf)
        next_tokens = np.full((n, k), pad_id, dtype=np.int64)
        origins = np.tile(np.arange(k), (n, 1))
        ended = []
        for j, b in enumerate(live):
            if done[b]:
                continue
            kept = 0
            for flat in top_candidates(total[j], 2 * k):
                beam, token, score = divmod(int(flat), vocab) + (float(total[j, flat]),)
                if score == -np.inf:
                    break
                if token == eos_id:
                    prefix = history[j * k + beam].tolist()
                    finished[b].append(Hypothesis(prefix, norm(score, t + 1)))
                    continue
                next_scores[j, kept], next_tokens[j, kept], origins[j, kept] = score, token, beam
                kept += 1
                if kept == k:
                    break
            finished[b].sort(key=lambda h: -h.score)
            del finished[b][n_best:]
            best_alive = norm(next_scores[j, 0], t + 1)
            if kept == 0 or (len(finished[b]) == n_best and finished[b][-1].score >= best_alive):
                done[b] = True
                ended.append(b)
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
