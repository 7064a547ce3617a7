"""The numeric kernels of a decoding step, on numpy arrays: log-softmax and its per-row normalisers, the rows'
best candidates, and beam search's selection over whole sentences, from the full logits or from the decoder's
search outputs (each row's best logits and its normaliser, computed in the graph). They hold no state: a caller
that wants a large batch's normalisers computed on two threads hands in its own helper thread (`helper`)."""

from __future__ import annotations

from concurrent.futures import Executor

import numpy as np

PARALLEL_ELEMENTS = 1 << 20  # below this, a second thread costs more than it saves


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def row_log_normalisers(logits: np.ndarray, scratch: np.ndarray | None = None,
                        helper: Executor | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(max, log-sum-exp of logits - max) per row, in float64: log_softmax(x) = (x - max) - lse, rounded as
    `log_softmax(logits.astype(float64))` rounds. `scratch`, a float64 array of the logits' shape, saves an
    allocation per step. With a `helper` (an executor with a thread to spare), batches of PARALLEL_ELEMENTS
    logits or more are split in two, the halves computed at once (numpy's ufuncs let go of the GIL), while the
    backend's threads are idle between steps; each row's sum is the same either way."""
    if scratch is None:
        scratch = np.empty(logits.shape, dtype=np.float64)
    if helper is None or logits.size < PARALLEL_ELEMENTS:
        return _normalisers(logits, scratch)
    half = len(logits) // 2
    other = helper.submit(_normalisers, logits[half:], scratch[half:])
    top, lse = _normalisers(logits[:half], scratch[:half])
    top2, lse2 = other.result()
    return np.concatenate([top, top2]), np.concatenate([lse, lse2])


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


def beam_candidates(logits: np.ndarray, scores: np.ndarray, n: int, skip: list[int] | None = None,
                    scratch: np.ndarray | None = None, helper: Executor | None = None,
                    banned: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each sentence's n best continuations. logits (S*K, V), K rows per sentence; scores (S, K), the beams'
    log-probabilities (-inf: not alive). Returns totals (S, n) float64 and flat indices beam * V + token,
    best first, ties to the lower index, padded with -inf and -1 where a sentence has fewer than n finite
    candidates: the prefix of a stable `argsort(-(scores + log_softmax(logits)))` over each sentence's K*V
    candidates that stops at the first -inf. `skip` (a suppressed eos, ids a model never generates) count in the
    softmax but are never candidates, as transformers' logits processors do it: they are set to -inf in `logits`,
    which are the caller's, in place; so are `banned` (rows, ids): ids of single rows (no_repeat_ngram_size's).
    log-softmax is monotone in each row, so a sentence's n best lie among its rows' n best logits: only those get a
    total. `scratch` and `helper`: as row_log_normalisers takes them."""
    sentences, k = scores.shape
    vocab = logits.shape[1]
    top, lse = row_log_normalisers(logits, scratch, helper)
    if skip:
        logits[:, skip] = -np.inf
    if banned is not None:
        logits[banned] = -np.inf
    flat_scores = scores.reshape(-1)
    r, c = row_candidates(logits, n, np.flatnonzero(flat_scores > -np.inf))
    total = flat_scores[r] + ((logits[r, c].astype(np.float64) - top[r]) - lse[r])
    return best_of_sentences(r, c, total, scores.shape, vocab, n)


def beam_candidates_from_top(top_logits: np.ndarray, top_ids: np.ndarray, log_norm: np.ndarray, scores: np.ndarray,
                             n: int, vocab: int, skip: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """beam_candidates from the decoder's search outputs instead of the logits: each row's C best logits
    (`top_logits`, largest first, ties to the lower id) and ids, and log_norm = log(sum(exp(logits - max))),
    with C at least n + len(skip). A row's n best candidates that are not skipped are among its C best, and a
    candidate's log-probability is (logit - max) - log_norm as in beam_candidates, with log_norm from the graph
    in float32 (beam_candidates sums in float64): totals may differ from it by the normaliser's rounding."""
    flat_scores = scores.reshape(-1)
    ok = (flat_scores > -np.inf)[:, None] & (top_logits > -np.inf)
    if skip:
        ok &= ~np.isin(top_ids, skip)
    r, j = np.nonzero(ok)
    top = top_logits[:, 0].astype(np.float64)
    total = flat_scores[r] + ((top_logits[r, j].astype(np.float64) - top[r]) - log_norm[r].astype(np.float64))
    return best_of_sentences(r, top_ids[r, j], total, scores.shape, vocab, n)


def best_of_sentences(r: np.ndarray, c: np.ndarray, total: np.ndarray, shape: tuple[int, int], vocab: int,
                      n: int) -> tuple[np.ndarray, np.ndarray]:
    """Candidates (row r, token c, total) of sentences of k rows each -> each sentence's n best totals and flat
    indices beam * vocab + token, best first, ties to the lower index, padded with -inf and -1."""
    sentences, k = shape
    sentence, flat = r // k, (r % k) * vocab + c
    order = np.lexsort((flat, -total, sentence))
    sentence, flat, total = sentence[order], flat[order], total[order]
    rank = np.arange(len(order)) - np.searchsorted(sentence, sentence)
    best = rank < n
    out_total, out_flat = np.full((sentences, n), -np.inf), np.full((sentences, n), -1, dtype=np.int64)
    out_total[sentence[best], rank[best]] = total[best]
    out_flat[sentence[best], rank[best]] = flat[best]
    return out_total, out_flat


def repeated_ngrams(sequences: np.ndarray, lengths: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """transformers' NoRepeatNGramLogitsProcessor: of each row of `sequences` (R, W), whose first lengths[r] ids are
    its tokens so far, the ids that would complete an n-gram those tokens already hold (one whose first n - 1 ids
    are its last n - 1). Returns (rows, ids), a row once for each n-gram it holds."""
    rows, width = sequences.shape
    if width < n or not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(sequences, n, axis=1)  # (R, W - n + 1, n): every n-gram
    inside = np.arange(width - n + 1)[None, :] <= (lengths - n)[:, None]  # the n-gram lies within the tokens
    last = np.clip(lengths[:, None] - (n - 1) + np.arange(n - 1), 0, width - 1)  # (R, n - 1)
    suffix = np.take_along_axis(sequences, last, axis=1)
    r, w = np.nonzero(inside & (windows[:, :, : n - 1] == suffix[:, None, :]).all(-1))
    return r, windows[r, w, n - 1]


def rows_index(at: np.ndarray) -> slice | np.ndarray:
    """What selects rows `at` of an array: a slice (a view) where they are one run (the common case), else `at`
    (a copy). Made once each time a group's rows change, not at each of a step's reads."""
    if len(at) and at[-1] - at[0] == len(at) - 1 and (len(at) < 3 or (np.diff(at) == 1).all()):
        return slice(int(at[0]), int(at[-1]) + 1)
    return at
