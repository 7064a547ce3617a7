"""Constrained beam search written the slow, obvious way (issue 50): one sentence at a time, one candidate at a
time, the terms a hypothesis meets found by looking for each sequence in its tokens. The oracle that
twostep.runtime.decoding.search.ConstrainedBeam (vectorised, an Aho-Corasick automaton per sentence) must
reproduce exactly: the same hypotheses, scores and unmet terms. Its rules are ConstrainedBeam's docstring's."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from twostep.runtime.decoding import Hypothesis

Logits = Callable[[tuple[int, ...]], np.ndarray]  # a sentence's generated tokens -> the next step's logits


def holds(tokens: Sequence[int], sequence: Sequence[int]) -> bool:
    n = len(sequence)
    return any(list(tokens[i : i + n]) == list(sequence) for i in range(len(tokens) - n + 1))


def met(tokens: Sequence[int], terms) -> set[int]:
    return {i for i, term in enumerate(terms) if any(holds(tokens, s) for s in term)}


def depth(tokens: Sequence[int], terms, done: set[int]) -> int:
    """The longest part (not empty, not whole) of a sequence of a term not met that the tokens end with."""
    return max((i for t, term in enumerate(terms) if t not in done for s in term for i in range(1, len(s))
                if list(tokens[len(tokens) - i :]) == list(s[:i])), default=0)


def ahead(tokens: Sequence[int], terms, done: set[int]) -> set[int]:
    """The tokens that extend a part (empty included) of a sequence of a term not met at the tokens' end."""
    return {s[i] for t, term in enumerate(terms) if t not in done for s in term for i in range(len(s))
            if i <= len(tokens) and list(tokens[len(tokens) - i :]) == list(s[:i])}


def log_softmax(row: np.ndarray) -> np.ndarray:
    top = row.max().astype(np.float64)
    shifted = row.astype(np.float64) - top
    return shifted - np.log(np.exp(shifted).sum())


def constrained_beam(logits_of: Logits, terms, *, beam_size: int, n_best: int, length_penalty: float, limit: int,
                     eos_id: int, never: Sequence[int] = ()) -> list[Hypothesis]:
    """One sentence: its n_best hypotheses."""
    def norm(score: float, length: int) -> float:
        return score / max(length, 1) ** length_penalty

    every = set(range(len(terms)))
    live = [((), 0.0)]  # (tokens, log-probability) in slot order
    finished: list[Hypothesis] = []

    def keep_best() -> None:
        finished.sort(key=lambda h: (len(h.unmet), -h.score))
        del finished[n_best:]

    for length in range(1, limit + 1):
        candidates = {}  # (beam, token) -> total
        best_of_all = []
        for b, (tokens, score) in enumerate(live):
            lp = log_softmax(logits_of(tokens))
            allowed = [t for t in range(len(lp)) if t not in never and lp[t] > -np.inf
                       and (t != eos_id or met(tokens, terms) == every)]
            best_of_all += [(score + lp[t], b * len(lp) + t, b, t) for t in allowed]
            if allowed:
                top = max(allowed, key=lambda t: (lp[t], -t))
                candidates[b, top] = score + lp[top]
            for t in ahead(tokens, terms, met(tokens, terms)) & set(allowed):
                candidates[b, t] = score + lp[t]
        best_of_all.sort(key=lambda x: (-x[0], x[1]))
        for total, _, b, t in best_of_all[: 2 * beam_size]:
            candidates[b, t] = total
        vocab = len(lp)
        walk = sorted(candidates.items(), key=lambda x: (-x[1], x[0][0] * vocab + x[0][1]))
        going_on_before = 0
        for (b, t), total in walk:
            if t == eos_id:
                if going_on_before < beam_size:
                    finished.append(Hypothesis(list(live[b][0]), norm(total, length)))
            else:
                going_on_before += 1
        if any(t == eos_id for (b, t), _ in walk):
            keep_best()
        banks: dict[tuple[int, int], list] = {}
        best = next(((b, t) for (b, t), _ in walk if t != eos_id), None)
        chosen = [(live[best[0]][0] + (best[1],), candidates[best])] if best is not None else []
        for (b, t), total in walk:
            if t != eos_id and (b, t) != best:
                tokens = live[b][0] + (t,)
                done = met(tokens, terms)
                bank = (len(done), depth(tokens, terms, done))
                banks.setdefault(bank, []).append((tokens, total))
        for turn in range(max((len(v) for v in banks.values()), default=0)):
            for bank in sorted(banks, reverse=True):
                if turn < len(banks[bank]):
                    chosen.append(banks[bank][turn])
        live = chosen[:beam_size]
        if not live:
            break
        best_alive = max(score for _, score in live) / max(length, 1) ** length_penalty
        if len(finished) == n_best and finished[-1].score >= best_alive:
            break
        if length == limit:
            for tokens, score in live:
                unmet = tuple(sorted(every - met(tokens, terms)))
                finished.append(Hypothesis(list(tokens), norm(score, length), unmet=unmet))
            keep_best()
    return finished[:n_best]
