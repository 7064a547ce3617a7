"""The search strategies. Each is a `Group`: the sentences of a running batch decoded with one DecodeOptions,
which turns what a step gives (the batch's logits, or the decoder's search outputs: each row's best logits and
its normaliser) into each of its rows' next token, step by step: `Greedy`, `Sampling`, `Beam`. Every row is
computed as if its sentence were alone, so what a sentence decodes does not depend on which sentences share its
group, or when it joined."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from twostep.runtime.decoding.constraints import Automaton, Constraints, Table, compiled
from twostep.runtime.decoding.kernels import (
    PARALLEL_ELEMENTS,
    beam_candidates,
    beam_candidates_from_top,
    best_of_sentences,
    log_softmax,
    repeated_ngrams,
    row_candidates,
    row_log_normalisers,
    rows_index,
)
from twostep.runtime.decoding.options import DecodeOptions, Hypothesis, Specials

ANY_VOCAB = 1 << 32  # beam * ANY_VOCAB + token orders candidates as beam * vocab + token does, for any vocab


class Group:
    """The sentences of a running batch decoded with one DecodeOptions, `k` rows each: sentence j owns the
    batch rows at[j * k : (j + 1) * k]. Per sentence: `steps` tokens generated so far, at most `limits`, the
    first `forced` of them forced by the batch (a target-language token: RunningBatch), which hypotheses leave
    out, and whether its owner `streams` (wants its tokens so far after each step: `progress`); `streaming`
    counts those that do."""

    k = 1

    def __init__(self, options: DecodeOptions, specials: Specials):
        self.options, self.specials = options, specials
        self.eos_id, self.pad_id = specials.eos_id, specials.pad_id  # read at every step
        self.blocked = specials.blocked(options.suppress_eos)  # ids a step never picks
        self.ngram = options.no_repeat_ngram_size
        self.owners: list = []
        self.at = np.zeros(0, np.int64)
        self.steps = np.zeros(0, np.int64)
        self.limits = np.zeros(0, np.int64)
        self.forced = np.zeros(0, np.int64)
        self.streams = np.zeros(0, bool)
        self.streaming = 0

    def __len__(self) -> int:
        return len(self.owners)

    @property
    def at(self) -> np.ndarray:
        """Each sentence's rows in the batch (k a sentence, in turn); `index` selects them from a step's arrays."""
        return self._at

    @at.setter
    def at(self, rows: np.ndarray) -> None:
        self._at, self.index = rows, rows_index(rows)

    @classmethod
    def rows_of(cls, options: DecodeOptions) -> int:
        """The batch rows a sentence decoded with `options` takes."""
        return 1

    def join(self, sources: list[list[int]], limits: list[int], owners: list, rows: np.ndarray,
             forced: list[int] | None = None, streams: list[bool] | None = None,
             constraints: list[Constraints | None] | None = None) -> None:
        """Sentences join (`constraints`: theirs, for a group that takes them: ConstrainedBeam)."""
        self.owners += owners
        self.at = np.concatenate([self.at, rows])
        self.steps = np.concatenate([self.steps, np.zeros(len(owners), np.int64)])
        self.limits = np.concatenate([self.limits, np.asarray(limits, np.int64)])
        self.forced = np.concatenate([self.forced, np.asarray(forced or [0] * len(owners), np.int64)])
        self.streams = np.concatenate([self.streams, np.asarray(streams or [False] * len(owners), bool)])
        self.streaming = int(self.streams.sum())
        self.joined(sources)

    def without_forced(self, j: int, hypotheses: list[Hypothesis]) -> list[Hypothesis]:
        n = int(self.forced[j])
        return [replace(h, tokens=h.tokens[n:]) for h in hypotheses] if n else hypotheses

    def leave(self, stay: np.ndarray) -> np.ndarray:
        """Keep the sentences `stay` (a mask); returns the rows of those that left."""
        blocks = self.at.reshape(-1, self.k)
        freed, self.at = blocks[~stay].reshape(-1), blocks[stay].reshape(-1)
        self.owners = [o for o, keep in zip(self.owners, stay) if keep]
        self.steps, self.limits, self.forced = self.steps[stay], self.limits[stay], self.forced[stay]
        self.streams = self.streams[stay]
        self.streaming = int(self.streams.sum())
        self.kept(stay)
        return freed

    def joined(self, sources: list[list[int]]) -> None:
        """New sentences were appended: extend the strategy's own state."""

    def kept(self, stay: np.ndarray) -> None:
        """Sentences left: keep the strategy's state of the others."""

    def close(self) -> None:
        """The group's last sentence left: let go of what the strategy holds beyond arrays (a thread)."""

    def candidates(self) -> int:
        """How many of a row's best logits a step needs: 0 if it needs them all."""
        return 0

    def progress(self) -> list[tuple[object, list[int]]]:
        """(owner, tokens so far, forced ones left out) of each sentence that streams and has generated a token
        of its own; beam search has no tokens so far (its best hypothesis can change until it is done): none."""
        return []

    def needs_logits(self, width: int) -> bool:
        """Whether a step needs the full logits, where the search outputs hold a row's `width` best: eos leaves
        the softmax of a sentence that has generated fewer than min_new_tokens (`early`); no_repeat_ngram_size
        bans ids row by row, any number of them."""
        return not 0 < self.candidates() + len(self.blocked) <= width or bool(self.early().any()) or self.ngram > 0

    def early(self) -> np.ndarray:
        """Which sentences have generated fewer than min_new_tokens tokens: eos is no candidate of theirs."""
        return self.steps < self.options.min_new_tokens

    def repeats(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """no_repeat_ngram_size's bans, (rows, ids) of this group's rows, given their tokens so far (k rows a
        sentence, steps[j] tokens each): the n-grams of the decoder's start token and those, as transformers' rule
        counts them. A sentence at a forced step bans nothing (its forced token wins, as transformers'
        forced_bos_token_id does). None: no such rule."""
        if not self.ngram:
            return None
        start = np.full((len(tokens), 1), self.specials.bos_id, np.int64)
        used = tokens[:, : int(self.steps.max(initial=0))]  # not the columns no sentence has reached
        lengths = np.repeat(np.where(self.steps >= self.forced, self.steps + 1, 0), self.k)
        return repeated_ngrams(np.concatenate([start, used], axis=1), lengths, self.ngram)

    def block_early_eos(self, logits: np.ndarray) -> None:
        """eos out of the early sentences' rows of the group's logits (in place, before any softmax)."""
        early = self.early()
        if early.any():
            logits[np.flatnonzero(np.repeat(early, self.k)), self.eos_id] = -np.inf

    def advance(self, step: dict[str, np.ndarray]) -> tuple[dict[int, list[Hypothesis]], np.ndarray,
                                                             np.ndarray | None]:
        """One step, given what it gives the whole batch (R rows): its "logits" (R, V), or, where needs_logits
        is false, only the search outputs "top_logits" and "top_ids" (R, C) and "log_norm" (R,). Returns the
        sentences done now (index -> their hypotheses), the next token of each of this group's rows, and for
        beam search each row's row of origin (an index into this group's rows), else None."""
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

    def candidates(self) -> int:
        return 1

    def progress(self) -> list[tuple[object, list[int]]]:
        return [(self.owners[j], self.out[j, self.forced[j] : self.steps[j]].tolist())
                for j in np.flatnonzero(self.streams & (self.steps > self.forced))]

    def pick(self, logits: np.ndarray) -> np.ndarray:
        return logits.argmax(-1)

    def advance(self, step: dict[str, np.ndarray]) -> tuple[dict[int, list[Hypothesis]], np.ndarray, None]:
        if "logits" in step:
            logits = step["logits"][self.index]
            if self.blocked:
                logits[:, self.blocked] = -np.inf
            self.block_early_eos(logits)
            if (banned := self.repeats(self.out)) is not None:
                logits[banned] = -np.inf
            next_ids = self.pick(logits)
        else:  # the first of each row's best that is not blocked: argmax's pick, ties to the lower id
            ids = step["top_ids"][self.index]
            first = ~np.isin(ids, self.blocked) if self.blocked else np.ones(ids.shape, bool)
            next_ids = ids[np.arange(len(ids)), first.argmax(1)]
        self.out[np.arange(len(self)), self.steps] = next_ids
        self.steps += 1
        is_eos = next_ids == self.eos_id
        length = self.steps - is_eos
        done = {int(j): [Hypothesis(self.out[j, self.forced[j] : length[j]].tolist(), 0.0)]
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

    def candidates(self) -> int:
        return 0  # the distribution, not only its best

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
    handled one by one. Once the group's logits reach PARALLEL_ELEMENTS, it starts a helper thread of its own
    for their normalisers (`helper`), which close() ends.

    With `beam_stop="transformers"` it keeps beam_size finished hypotheses instead of n_best (and returns the
    n_best best), and a candidate that ends in eos finishes only if it is among the step's beam_size best: the
    rule of transformers' generate() (early_stopping=False), which can run longer and find a different best.
    "transformers_early" (early_stopping=True) is done once it holds beam_size finished hypotheses;
    "transformers_never" (early_stopping="never") with length_penalty > 0 normalises the best live one at the
    sentence's limit instead of its current length (transformers' max_length), so it runs on while a longer
    hypothesis could still win.

    With `beam_stop="ctranslate2"` it is CTranslate2's BeamSearch (decoding.cc, patience 1): `advance_ctranslate2`."""

    def __init__(self, *args):
        super().__init__(*args)
        o = self.options
        self.k, self.n_best, self.length_penalty = o.beam_size, o.n_best, o.length_penalty
        self.hf_rule = o.beam_stop in ("transformers", "transformers_early", "transformers_never")
        self.hf_early = o.beam_stop == "transformers_early"
        self.hf_never = o.beam_stop == "transformers_never" and o.length_penalty > 0
        self.ct2_rule = o.beam_stop == "ctranslate2"
        self.top_ended = np.zeros(0, bool)  # ctranslate2: a step's best candidate has ended (sticky)
        self.pool = self.k if self.hf_rule else self.n_best  # finished hypotheses kept per sentence
        self.scores = np.zeros((0, self.k))  # each beam's log-probability; -inf: not alive
        self.history = np.zeros((0, 0), np.int64)  # each row's tokens, steps[j] of them
        self.finished: list[list[Hypothesis]] = []
        self.worst = np.zeros(0)  # the score of finished[j][-1] once it holds pool of them
        self.scratch = None
        self.helper: ThreadPoolExecutor | None = None
        self.powers: dict[int, float] = {}

    @classmethod
    def rows_of(cls, options: DecodeOptions) -> int:
        return options.beam_size

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
        self.top_ended = np.concatenate([self.top_ended, np.zeros(m, bool)])

    def kept(self, stay: np.ndarray) -> None:
        self.scores, self.worst, self.top_ended = self.scores[stay], self.worst[stay], self.top_ended[stay]
        self.history = self.history[np.repeat(stay, self.k)]
        self.finished = [f for f, keep in zip(self.finished, stay) if keep]

    def close(self) -> None:
        if self.helper is not None:
            self.helper.shutdown()
            self.helper = None

    def keep_best(self, j: int) -> None:
        self.finished[j].sort(key=lambda h: -h.score)
        del self.finished[j][self.pool :]
        if len(self.finished[j]) == self.pool:
            self.worst[j] = self.finished[j][-1].score

    def best(self, j: int) -> list[Hypothesis]:
        return self.without_forced(j, self.finished[j][: self.n_best])

    def candidates(self) -> int:
        return 2 * self.k

    def needs_logits(self, width: int) -> bool:
        """CTranslate2 takes the ids a step never picks out of the softmax: that needs their logits."""
        return super().needs_logits(width) or (self.ct2_rule and bool(self.blocked))

    def advance(self, step: dict[str, np.ndarray]) -> tuple[dict[int, list[Hypothesis]], np.ndarray, np.ndarray]:
        n, k = len(self), self.k
        if "logits" in step:
            vocab = step["logits"].shape[1]
            total, flat = self.from_logits(step["logits"][self.index])  # (n*K, V)
        else:
            vocab = ANY_VOCAB
            total, flat = beam_candidates_from_top(
                step["top_logits"][self.index], step["top_ids"][self.index],
                step["log_norm"][self.index], self.scores, 2 * k, vocab, self.blocked)
        beam, token = np.divmod(flat, vocab)
        if self.ct2_rule:
            return self.advance_ctranslate2(total, beam, token)
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
        if self.hf_rule:
            ending[:, k:] = False
        for j, c in zip(*np.nonzero(ending)):
            tokens = self.history[j * k + beam[j, c], : self.steps[j]].tolist()
            self.finished[j].append(Hypothesis(tokens, self.norm(float(total[j, c]), int(length[j]))))
        for j in np.flatnonzero(ending.any(axis=1)):
            self.keep_best(j)
        if self.hf_early:  # at its limit a full sentence still takes its live beams (transformers' max_length)
            full = self.worst > -np.inf  # it holds pool finished hypotheses
            ends = ~kept.any(axis=1) | (full & (length < self.limits))
        else:  # the best live hypothesis, normalised where it would score best, cannot beat the worst finished one
            best_at = self.limits if self.hf_never else length
            best_alive = next_scores[:, 0] / np.array([self.power(int(x)) for x in best_at])
            ends = ~kept.any(axis=1) | (self.worst >= best_alive)
        rows = (np.arange(n)[:, None] * k + origins).reshape(-1)
        self.history = self.history[rows]
        self.history[np.arange(n * k), np.repeat(self.steps, k)] = next_tokens.reshape(-1)
        self.scores, self.steps = next_scores, length
        done = {int(j): self.best(j) for j in np.flatnonzero(ends)}
        for j in np.flatnonzero(~ends & (self.steps >= self.limits)):  # live beams count as finished
            for b in range(k):
                if self.scores[j, b] > -np.inf:
                    tokens = self.history[j * k + b, : self.steps[j]].tolist()
                    self.finished[j].append(Hypothesis(tokens, self.norm(self.scores[j, b], int(self.steps[j]))))
            self.keep_best(j)
            done[int(j)] = self.best(j)
        return done, next_tokens.reshape(-1), rows

    def advance_ctranslate2(self, total: np.ndarray, beam: np.ndarray,
                            token: np.ndarray) -> tuple[dict[int, list[Hypothesis]], np.ndarray, np.ndarray]:
        """CTranslate2's step, given each sentence's 2k best candidates (total, beam, token), best first. Only the
        first k can end: an eos among them finishes its hypothesis, and its slot takes the next candidate past k
        that is not an eos (an eos there finishes nothing); slot s keeps candidate s otherwise. At a sentence's
        limit (its last step) the first k all finish, those that go on with their new token, and the sentence is
        done. Otherwise it is done once it has k finished hypotheses, or, with length_penalty 0, once its best
        candidate has ended at some step and it has n_best. A finished hypothesis scores its log-probability /
        length ** length_penalty, its length counting its eos (CTranslate2 scores hypotheses with their eos and
        drops it afterwards): the step's, for any hypothesis finished at it. Its eos is left out."""
        n, k = len(self), self.k
        valid = total > -np.inf
        is_eos = valid & (token == self.eos_id)
        ending = is_eos[:, :k]
        # the r-th eos among the first k takes the r-th candidate past k that is not an eos
        later = valid[:, k:] & ~is_eos[:, k:]
        refill = np.full((n, k), -1, np.int64)  # -1: a sentence has fewer (its slot dies)
        j, c = np.nonzero(later)
        refill[j, np.cumsum(later, axis=1)[j, c] - 1] = k + c
        pick = np.tile(np.arange(k), (n, 1))
        j, s = np.nonzero(ending)
        pick[j, s] = refill[j, np.cumsum(ending, axis=1)[j, s] - 1]
        alive = pick >= 0
        pick = np.where(alive, pick, 0)
        rows = np.arange(n)[:, None]
        alive &= valid[rows, pick]
        next_scores = np.where(alive, total[rows, pick], -np.inf)
        next_tokens = np.where(alive, token[rows, pick], self.pad_id)
        origins = np.where(alive, beam[rows, pick], np.arange(k))
        self.top_ended |= is_eos[:, 0]
        length = self.steps + 1
        last = length >= self.limits
        for j, c in zip(*np.nonzero(ending | (last[:, None] & valid[:, :k]))):
            tokens = self.history[j * k + beam[j, c], : self.steps[j]].tolist()
            if not is_eos[j, c]:
                tokens.append(int(token[j, c]))
            self.finished[j].append(Hypothesis(tokens, self.norm(float(total[j, c]), int(length[j]))))
        count = np.array([len(f) for f in self.finished])
        if self.length_penalty == 0:
            ends = last | (self.top_ended & (count >= self.n_best))
        else:
            ends = last | (count >= k)
        ends |= ~alive.any(axis=1)
        rows = (rows * k + origins).reshape(-1)
        self.history = self.history[rows]
        self.history[np.arange(n * k), np.repeat(self.steps, k)] = next_tokens.reshape(-1)
        self.scores, self.steps = next_scores, length
        done = {int(j): self.ctranslate2_best(j) for j in np.flatnonzero(ends)}
        return done, next_tokens.reshape(-1), rows

    def ctranslate2_best(self, j: int) -> list[Hypothesis]:
        """A sentence's finished hypotheses, best first (all of them are kept until it is done), n_best of them."""
        self.finished[j].sort(key=lambda h: -h.score)
        return self.without_forced(j, self.finished[j][: self.n_best])

    def from_logits(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.scratch is None or self.scratch.shape[0] < logits.shape[0]:  # the group grew
            self.scratch = np.empty(logits.shape, dtype=np.float64)
            if self.helper is None and logits.size >= PARALLEL_ELEMENTS:
                self.helper = ThreadPoolExecutor(1, thread_name_prefix="twostep-beam")
        skip = self.blocked
        if self.ct2_rule and skip:  # out of the softmax, as CTranslate2's DisableTokens
            logits[:, skip] = -np.inf
            skip = None
        self.block_early_eos(logits)
        return beam_candidates(logits, self.scores, 2 * self.k, skip, self.scratch[: logits.shape[0]], self.helper,
                               self.repeats(self.history))


CONSTRAINED_BEAM = 4  # the beam of a constrained sentence whose options ask for fewer (greedy: beam 1)
DEPTHS = 1 << 20  # a bank: terms met * DEPTHS + depth inside a term not met (a sequence is shorter than this)


class ConstrainedBeam(Beam):
    """Beam search under lexical constraints, each sentence its own (decoding.constraints: terms, each one token
    sequence of several that must appear in the output). Dynamic beam allocation (Post & Vilar, NAACL 2018),
    vectorised over the group's rows (Hu et al., NAACL 2019; fairseq's LexicallyConstrainedBeamSearch):

    - A step's candidates, per sentence: its 2k best (as Beam's), each live beam's tokens that take it further
      into a term it has not met (Table.tokens_ahead), and each live beam's best token; once each.
    - eos is no candidate of a beam that has not met every term (it stays in the softmax).
    - An eos candidate finishes its hypothesis as in Beam: if fewer than k of the candidates before it (best
      first, ties to the lower beam * V + token) go on.
    - The k that go on: the best candidate (whatever it meets: the search does not lose the model's own
      translation, which may meet the terms by itself), then the others by bank. A candidate's bank is the terms
      it has met, then how many tokens deep it is inside a sequence of a term it has not (Table.depth), the higher
      the fuller. Best first within each bank, the banks take turns, the fullest first: the best of the fullest
      bank, the best of the next, ..., then each bank's second best, ...
    - A sentence is done as under the "n_best" rule (whatever `beam_stop` says): it has n_best finished
      hypotheses (all of which meet every term) and the best live one, normalised at its length, cannot beat the
      worst of them; or no candidate goes on; or at its limit, where its live beams finish too, those that miss
      a term with `unmet` set, after every hypothesis that meets them all.

    The beam is the options' beam_size, at least CONSTRAINED_BEAM (a greedy request's constrained sentence is
    searched with CONSTRAINED_BEAM beams and gives its best). Terms are tracked from the first token after the
    forced ones."""

    def __init__(self, options: DecodeOptions, specials: Specials):
        super().__init__(options, specials)  # Entry refuses sampling with constraints
        self.k = self.rows_of(options)
        self.scores = np.zeros((0, self.k))
        self.hf_rule = self.hf_early = self.hf_never = self.ct2_rule = False
        self.pool = self.n_best
        self.automata: list[Automaton] = []
        self.every = np.zeros(0, np.int64)  # each sentence's mask of every term met
        self.state = np.zeros(0, np.int64)  # each row's automaton state, its sentence's own (0: the root)
        self.met = np.zeros(0, np.int64)  # each row's mask of the terms met
        self.table = Table([])
        self.coming: list[Constraints] = []

    @classmethod
    def rows_of(cls, options: DecodeOptions) -> int:
        return max(options.beam_size, CONSTRAINED_BEAM)

    def join(self, sources, limits, owners, rows, forced=None, streams=None, constraints=None) -> None:
        if constraints is None or len(constraints) != len(owners) or any(c is None for c in constraints):
            raise ValueError("a constrained group's sentences each need their constraints")
        self.coming = list(constraints)
        super().join(sources, limits, owners, rows, forced, streams)

    def joined(self, sources: list[list[int]]) -> None:
        super().joined(sources)
        self.automata += [compiled(c) for c in self.coming]
        self.every = np.concatenate([self.every, [c.every for c in self.coming]]).astype(np.int64)
        self.state = np.concatenate([self.state, np.zeros(len(sources) * self.k, np.int64)])
        self.met = np.concatenate([self.met, np.zeros(len(sources) * self.k, np.int64)])
        self.table, self.coming = Table(self.automata), []

    def kept(self, stay: np.ndarray) -> None:
        super().kept(stay)
        self.automata = [a for a, keep in zip(self.automata, stay) if keep]
        rows = np.repeat(stay, self.k)
        self.every, self.state, self.met = self.every[stay], self.state[rows], self.met[rows]
        self.table = Table(self.automata)

    def needs_logits(self, width: int) -> bool:
        return True  # a token ahead may be any token

    def keep_best(self, j: int) -> None:
        self.finished[j].sort(key=lambda h: (len(h.unmet), -h.score))
        del self.finished[j][self.pool :]
        if len(self.finished[j]) == self.pool:
            self.worst[j] = self.finished[j][-1].score

    def unmet(self, j: int, met: int) -> tuple[int, ...]:
        return tuple(i for i in range(int(self.every[j]).bit_length()) if not met >> i & 1)

    def advance(self, step: dict[str, np.ndarray]) -> tuple[dict[int, list[Hypothesis]], np.ndarray, np.ndarray]:
        n, k = len(self), self.k
        logits = step["logits"][self.index]
        vocab = logits.shape[1]
        if self.scratch is None or self.scratch.shape[0] < len(logits):
            self.scratch = np.empty(logits.shape, dtype=np.float64)
        self.block_early_eos(logits)
        top, lse = row_log_normalisers(logits, self.scratch[: len(logits)])
        if self.blocked:
            logits[:, self.blocked] = -np.inf
        logits[np.flatnonzero(self.met != np.repeat(self.every, k)), self.eos_id] = -np.inf
        if (banned := self.repeats(self.history)) is not None:
            logits[banned] = -np.inf
        flat_scores = self.scores.reshape(-1)
        alive = np.flatnonzero(flat_scores > -np.inf)
        # the candidates: each sentence's 2k best, each live beam's tokens ahead and its best token
        r, c = row_candidates(logits, 2 * k, alive)
        _, best = best_of_sentences(r, c, flat_scores[r] + ((logits[r, c].astype(np.float64) - top[r]) - lse[r]),
                                    (n, k), vocab, 2 * k)
        j, i = np.nonzero(best >= 0)
        base = np.repeat(self.table.offset[:-1], k)
        which, ahead = self.table.tokens_ahead(self.state[alive] + base[alive], self.met[alive])
        rows = np.concatenate([j * k + best[j, i] // vocab, alive[which], alive])
        tokens = np.concatenate([best[j, i] % vocab, ahead, logits[alive].argmax(1)]).astype(np.int64)
        key = np.unique(rows * vocab + tokens.astype(np.int64))
        rows, tokens = key // vocab, key % vocab
        total = flat_scores[rows] + ((logits[rows, tokens].astype(np.float64) - top[rows]) - lse[rows])
        finite = total > -np.inf
        rows, tokens, total = rows[finite], tokens[finite], total[finite]
        sentence, beam = rows // k, rows % k
        tracking = np.repeat(self.steps >= self.forced, k)[rows]  # not at a forced step
        now = self.state[rows] + base[rows]
        after = np.where(tracking, self.table.advance(now, tokens), now)
        met = self.met[rows] | np.where(tracking, self.table.done[after], 0)
        bank = np.bitwise_count(met).astype(np.int64) * DEPTHS + self.table.depth(after, met)
        # eos: as Beam's walk, best first
        flat = beam * vocab + tokens
        order = np.lexsort((flat, -total, sentence))
        is_eos = tokens[order] == self.eos_id
        going_on = (~is_eos).astype(np.int64)
        before = within(np.cumsum(going_on) - going_on, sentence[order])
        ending = order[is_eos & (before < k)]
        # the k that go on: the best, then the banks take turns, the fullest first
        on = np.flatnonzero(tokens != self.eos_id)
        best_first = on[np.lexsort((flat[on], -total[on], sentence[on]))]
        first = best_first[np.concatenate([[True], sentence[best_first][1:] != sentence[best_first][:-1]])]
        rest = np.setdiff1d(on, first)
        by_bank = rest[np.lexsort((flat[rest], -total[rest], -bank[rest], sentence[rest]))]
        turn = np.concatenate([np.full(len(first), -1), within(np.arange(len(by_bank)), sentence[by_bank],
                                                               bank[by_bank])])
        by_bank = np.concatenate([first, by_bank])
        chosen = by_bank[np.lexsort((-bank[by_bank], turn, sentence[by_bank]))]
        slot = within(np.arange(len(chosen)), sentence[chosen])
        chosen, slot = chosen[slot < k], slot[slot < k]
        next_scores = np.full((n, k), -np.inf)
        next_tokens = np.full((n, k), self.pad_id, dtype=np.int64)
        origins = np.tile(np.arange(k), (n, 1))
        next_state, next_met = np.zeros((n, k), np.int64), np.zeros((n, k), np.int64)
        js = sentence[chosen]
        next_scores[js, slot], next_tokens[js, slot], origins[js, slot] = total[chosen], tokens[chosen], beam[chosen]
        next_state[js, slot], next_met[js, slot] = after[chosen] - base[rows[chosen]], met[chosen]
        length = self.steps + 1
        for e in ending:
            j = int(sentence[e])
            history = self.history[rows[e], : self.steps[j]].tolist()
            self.finished[j].append(Hypothesis(history, self.norm(float(total[e]), int(length[j]))))
        for j in np.unique(sentence[ending]):
            self.keep_best(int(j))
        going = next_scores > -np.inf
        best_alive = np.where(going.any(axis=1), next_scores.max(axis=1), -np.inf) / \
            np.array([self.power(int(x)) for x in length])
        ends = ~going.any(axis=1) | (self.worst >= best_alive)
        rows = (np.arange(n)[:, None] * k + origins).reshape(-1)
        self.history = self.history[rows]
        self.history[np.arange(n * k), np.repeat(self.steps, k)] = next_tokens.reshape(-1)
        self.scores, self.steps = next_scores, length
        self.state, self.met = next_state.reshape(-1), next_met.reshape(-1)
        done = {int(j): self.best(j) for j in np.flatnonzero(ends)}
        for j in np.flatnonzero(~ends & (self.steps >= self.limits)):  # live beams count as finished
            for b in np.flatnonzero(going[j]):
                history = self.history[j * k + b, : self.steps[j]].tolist()
                self.finished[j].append(Hypothesis(history, self.norm(self.scores[j, b], int(self.steps[j])),
                                                   unmet=self.unmet(j, int(self.met[j * k + b]))))
            self.keep_best(j)
            done[int(j)] = self.best(j)
        return done, next_tokens.reshape(-1), rows


def within(counts: np.ndarray, *keys: np.ndarray) -> np.ndarray:
    """`counts` (a running count, non-decreasing) made relative to the start of each run of entries with equal
    `keys` (sorted so that equal keys are together): each entry's count since its run began."""
    if not len(counts):
        return counts
    starts = np.zeros(len(counts), bool)
    starts[0] = True
    for key in keys:
        starts[1:] |= key[1:] != key[:-1]
    return counts - np.maximum.accumulate(np.where(starts, counts, 0))


def strategy(options: DecodeOptions) -> type[Group]:
    return Sampling if options.sampling else Beam if options.beam_size > 1 else Greedy
