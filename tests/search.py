"""Each search strategy as one function, for the tests: `decode` with the DecodeOptions that ask for it, as
the Translator calls it. The product has no such entry points: it decodes through `decode` and RunningBatch."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np

from twostep.errors import BadInput
from twostep.runtime.decoding import DecodeOptions, Hypothesis, Specials, StepSession, decode
from twostep.runtime.decoding.search import Beam

SPECIALS = Specials(pad_id=0, bos_id=2, eos_id=3, unk_id=1)  # a ModelConfig's defaults: every test model's ids


def greedy(session: StepSession, sources: Sequence[Sequence[int]], *, specials: Specials, max_new_tokens: int,
           suppress_eos: bool = False) -> list[list[int]]:
    """Batched greedy decoding; each result stops before its eos (or at max_new_tokens)."""
    hyps = decode(session, sources, DecodeOptions(suppress_eos=suppress_eos), specials=specials,
                  max_new_tokens=max_new_tokens)
    return [h[0].tokens for h in hyps]


def beam_search(session: StepSession, sources: Sequence[Sequence[int]], *, beam_size: int, specials: Specials,
                max_new_tokens: int, length_penalty: float = 1.0, n_best: int = 1,
                suppress_eos: bool = False) -> list[list[Hypothesis]]:
    """Batched beam search (see Beam); with beam_size 1 too (scored, where greedy is not)."""
    if not 1 <= n_best <= beam_size:
        raise BadInput(f"n_best must be between 1 and the beam size {beam_size}, got {n_best}")
    options = DecodeOptions(beam_size=beam_size, length_penalty=length_penalty, n_best=n_best,
                            suppress_eos=suppress_eos)
    return decode(session, sources, options, specials=specials, max_new_tokens=max_new_tokens, group=Beam)


def sample(session: StepSession, sources: Sequence[Sequence[int]], *, specials: Specials, max_new_tokens: int,
           temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None) -> list[list[int]]:
    """Batched sampling (see Sampling)."""
    if temperature <= 0:
        raise BadInput(f"temperature must be positive, got {temperature}")
    if not 0 < top_p <= 1:
        raise BadInput(f"top_p must be in (0, 1], got {top_p}")
    options = DecodeOptions(sampling=True, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    hyps = decode(session, sources, options, specials=specials, max_new_tokens=max_new_tokens)
    return [h[0].tokens for h in hyps]


class HistorySession:
    """A step session whose logits are a pseudo-random function of each row's history, so that every reorder
    matters; `rounded` makes ties everywhere."""

    def __init__(self, vocab: int, seed: int, rounded: bool):
        self.vocab, self.seed, self.rounded = vocab, seed, rounded

    def start(self, input_ids, attention_mask):
        self.rows = [tuple(r[: n]) for r, n in zip(input_ids.tolist(), attention_mask.sum(1))]

    def admit(self, input_ids, attention_mask, sources, rows):
        self.rows += [()] * (max(rows) + 1 - len(self.rows))
        for source, row in zip(sources, rows):
            self.rows[row] = tuple(input_ids[source, : attention_mask[source].sum()].tolist())

    def release(self, rows):
        pass

    def step(self, input_ids):
        self.rows = [h + (int(t),) for h, t in zip(self.rows, input_ids[:, 0])]
        out = np.empty((len(self.rows), self.vocab), np.float32)
        for i, h in enumerate(self.rows):
            row = np.random.default_rng([self.seed, len(h), *h]).standard_normal(self.vocab) * 3
            out[i] = np.round(row) if self.rounded else row
        return out

    def reorder(self, origin, cache_only=False):
        self.rows = [self.rows[i] for i in origin]

    def claimed(self):
        return contextlib.nullcontext()
