"""The running batch: sentences decoding together on one step session, each with its own options and limit.

A backend hands the loop a `StepSession`: it encodes sentences, then runs one decoder step at a time for
every row of its batch, keeping the decoder's inputs wherever it likes (host or device). The loop only ever
sees what the search needs of the last position (each row's best logits and its normaliser, computed in the
graph, or the full logits where a search needs them: sampling, or a decoder without search outputs) and sends
back token ids, beam origins for beam search, and which rows sentences take and leave.

Sentences join a `RunningBatch` at any step boundary (their encoder runs alone, their rows start with an empty
history next to rows that are further on) and leave at the step they are done, so one batch can run for as
long as sentences keep coming (the serving executor's in-flight batching). The sentences that share options
are one search strategy's `Group` (decoding.search). Every row is computed as if its sentence were alone, so
what a sentence decodes does not depend on which sentences share its batch, or when it joined. `decode` is the
static case: every sentence joins at the first step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from twostep.errors import BadInput
from twostep.runtime.decoding.constraints import Constraints
from twostep.runtime.decoding.options import DecodeOptions, Hypothesis, Specials
from twostep.runtime.decoding.search import ConstrainedBeam, Group, strategy


class StepSession(Protocol):
    def claimed(self) -> AbstractContextManager:
        """Held while one thread decodes on the session: a session holds one batch's cache, so a second
        thread's claim is refused (SessionBusy), not waited for."""

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

    search_width: int  # the row's best logits the search outputs hold (C); 0 if the session gives none

    def search_step(self, input_ids: np.ndarray, need_logits: bool = True) -> dict[str, np.ndarray]:
        """As step, returning what the search reads: "logits" (B, V) if `need_logits` (or search_width is 0),
        and where search_width > 0 the search outputs of the last position (twostep.artifact.spec):
        "top_logits" (B, C) float32, the row's C largest logits, largest first, ties to the lower id; "top_ids"
        (B, C) int64; "log_norm" (B,) float32, log(sum(exp(logits - top_logits[:, 0])))."""

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


@dataclass(frozen=True)
class Entry:
    """A sentence joining a running batch: its source ids, options, max_new_tokens (`limit`) and an `owner`
    that step() hands back with its hypotheses. `group` overrides the strategy options imply (beam search
    with one beam). `prefix`: tokens forced after the decoder's start token, one a step (a target-language
    token); they count as generated tokens (against the limit, in beam search's length), as transformers
    counts them, and hypotheses leave them out. `stream`: its owner wants its tokens so far after each step
    (RunningBatch.progress). `alone`: it decodes in a search group of its own, not with the sentences that share
    its options (a sentence retried after a fault in its group: RunningBatch's `on_fault`). `constraints`: terms
    its output must hold (a glossary's: search.ConstrainedBeam)."""

    source: Sequence[int]
    options: DecodeOptions
    limit: int
    owner: object
    group: type[Group] | None = None
    prefix: Sequence[int] = ()
    stream: bool = False
    alone: bool = False
    constraints: Constraints | None = None

    def __post_init__(self) -> None:
        if self.constraints is not None and self.options.sampling:
            raise BadInput("a glossary or constraints need beam search or greedy decoding, not sampling")

    def key(self) -> tuple:
        """Its search group's key: the strategy and the options, and its owner where it decodes alone. A
        sentence with constraints decodes with ConstrainedBeam, whatever its options' strategy."""
        cls = ConstrainedBeam if self.constraints is not None else self.group or strategy(self.options)
        return (cls, self.options, self.owner) if self.alone else (cls, self.options)


OnFault = Callable[[list, Exception], None]  # (the owners of a search group that raised, what it raised)


class RunningBatch:
    """Sentences decoding together on one step session, each with its own options and limit. `add` lets
    sentences join between steps: one encoder run for all of them, each takes a free row (or new rows at the
    end, k for a beam), starting from bos. `step` runs one decoder step for every row and returns the sentences
    that are done; their rows are released then, and rows whose `cancelled(owner)` is true too, unanswered.
    Rows left free are filled by the next sentences that join; once more than `compact_at` of the batch's rows
    are free, the rest are moved together (the only time rows that stay are copied). `specials`: the model's
    token ids. A row with forced tokens left (`forced`, -1 padded, from column `forced_at`) has its logits
    replaced by a one-hot log-probability at the step: every strategy then picks the token, with score 0 (as
    transformers' ForcedBOSTokenLogitsProcessor does).

    Streaming: after a step, `progress()` gives the tokens so far of the sentences that joined with
    `Entry.stream` and are still decoding with greedy search or sampling; `streaming` counts the sentences that
    stream, so that a caller asks only when one does (a step itself does nothing more for them).

    Faults. A search group that raises (joining, advancing, reporting progress) is its sentences' fault: with
    `on_fault`, the group leaves the batch, its rows freed, and `on_fault(its owners, the exception)` is told,
    while the other groups go on as if it had never been there (rows are computed apart); without it, the
    exception propagates. The session's own exceptions cannot be put on a sentence: `add` and `step` raise them
    (the batch's state is then lost: start a new one), except one raised after a step's groups advanced (moving
    or releasing rows), which leaves the sentences done at that step whole: `step` returns them and sets
    `broken` to the exception. A group that raised as the session then did is not told to on_fault: its owners
    stay among `owners()`, with the batch's. A TwostepError from the session's encoder is a refusal before
    anything changed."""

    def __init__(self, session: StepSession, *, specials: Specials,
                 cancelled: Callable[[object], bool] | None = None, compact_at: float = 0.25,
                 on_fault: OnFault | None = None):
        self.session, self.specials = session, specials
        self.cancelled, self.compact_at, self.on_fault = cancelled, compact_at, on_fault
        self.broken: Exception | None = None  # the session raised after a step's groups advanced
        self.stranded: list = []  # owners of groups that raised, left unanswered as the session raised freeing them
        self.groups: dict[tuple, Group] = {}
        self.tokens = np.zeros(0, np.int64)  # each row's next token
        self.forced = np.full((0, 0), -1, np.int64)  # each row's forced tokens
        self.forced_at = np.zeros(0, np.int64)  # each row's next forced column
        self.free: list[int] = []
        self.rows = 0

    @property
    def sentences(self) -> int:
        return sum(len(g) for g in self.groups.values())

    @property
    def live_rows(self) -> int:
        return self.rows - len(self.free)

    def owners(self) -> list:
        """The owners of the sentences decoding, and of those whose group raised as the session did (`stranded`)."""
        return [owner for g in self.groups.values() for owner in g.owners] + self.stranded

    @property
    def streaming(self) -> int:
        """Sentences decoding whose owner wants their tokens so far."""
        return sum(g.streaming for g in self.groups.values())

    def progress(self) -> list[tuple[object, list[int]]]:
        """(owner, tokens so far) of each sentence still decoding that streams and has generated a token past
        its forced ones (Entry.prefix, left out), with greedy search or sampling: a beam's best can change until
        its sentence is done (step() returns it then). eos is never among them: a sentence is done at its eos."""
        out, faults = [], []
        for key, g in self.groups.items():
            if g.streaming:
                try:
                    out += g.progress()
                except Exception as exc:
                    faults.append((key, exc, None))
        self.faulted(faults)
        return out

    def faulted(self, faults: list[tuple[tuple, Exception, np.ndarray | None]]) -> None:
        """Search groups that raised, (key, exception, rows taken for it as it joined): without on_fault, the first
        exception goes on; with it, the groups leave, their rows freed, and on_fault hears of each one's owners.
        If the session raises freeing the rows, that goes on instead, and their owners are `stranded`."""
        if not faults:
            return
        if self.on_fault is None:
            raise faults[0][1]
        left = []
        for key, exc, rows in faults:
            g = self.groups.pop(key)
            with contextlib.suppress(Exception):
                g.close()
            left.append((g, exc, g.at if rows is None else np.union1d(g.at, rows).astype(np.int64)))
        try:
            self.release(np.concatenate([rows for _, _, rows in left]))
        except Exception:  # the session's fault now: theirs is told with the batch's (owners())
            self.stranded += [owner for g, _, _ in left for owner in g.owners]
            raise
        for g, exc, _ in left:
            self.on_fault(list(g.owners), exc)

    def release(self, rows: np.ndarray) -> None:
        """Rows whose sentences left: the session forgets them, and the batch reuses them."""
        if len(rows):
            self.session.release(rows)
            self.free += rows.tolist()
            self.compact()

    def add(self, entries: Sequence[Entry]) -> list[tuple[object, list[Hypothesis]]]:
        """Sentences join; those with a limit of 0 are done at once (returned). If the session refuses them
        (an exception from its encoder), the batch is as it was."""
        done = [(e.owner, [Hypothesis([], 0.0)]) for e in entries if e.limit < 1]
        entries = [e for e in entries if e.limit >= 1]
        if not entries:
            return done
        ids, mask = pad_batch([e.source for e in entries], self.specials.pad_id)
        keys = [e.key() for e in entries]
        counts = np.array([key[0].rows_of(e.options) for e, key in zip(entries, keys)])
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
        self.tokens[rows] = self.specials.bos_id
        self.force(entries, counts, rows)
        first = np.concatenate([[0], np.cumsum(counts)])
        joining: dict[tuple, list[int]] = {}
        for i, key in enumerate(keys):
            joining.setdefault(key, []).append(i)
        faults = []
        for key, mine in joining.items():
            taken = np.concatenate([rows[first[i] : first[i + 1]] for i in mine])
            if key not in self.groups:
                self.groups[key] = key[0](key[1], self.specials)
            try:  # Group.join adds the owners first: one that raises leaves whole, these with it
                self.groups[key].join([list(entries[i].source) for i in mine], [entries[i].limit for i in mine],
                                      [entries[i].owner for i in mine], taken,
                                      [len(entries[i].prefix) for i in mine], [entries[i].stream for i in mine],
                                      [entries[i].constraints for i in mine])
            except Exception as exc:
                faults.append((key, exc, taken))
        self.faulted(faults)
        return done

    def force(self, entries: Sequence[Entry], counts: np.ndarray, rows: np.ndarray) -> None:
        """The joining rows' forced tokens (each sentence's prefix on each of its rows)."""
        width = max([self.forced.shape[1]] + [len(e.prefix) for e in entries])
        forced = np.full((self.rows, width), -1, np.int64)
        forced[: len(self.forced), : self.forced.shape[1]] = self.forced
        forced_at = np.concatenate([self.forced_at, np.zeros(self.rows - len(self.forced_at), np.int64)])
        forced[rows] = -1
        forced_at[rows] = 0
        for row, entry in zip(rows, np.repeat(np.arange(len(entries)), counts)):
            prefix = entries[entry].prefix
            forced[row, : len(prefix)] = prefix
        self.forced, self.forced_at = forced, forced_at

    def forcing(self, step: dict[str, np.ndarray]) -> None:
        """Rows with a forced token at this step: their logits become its one-hot log-probability (in the search
        outputs: the token the only candidate, with logit and log_norm 0)."""
        if not self.forced.shape[1]:
            return
        at = np.minimum(self.forced_at, self.forced.shape[1] - 1)
        token = np.where(self.forced_at < self.forced.shape[1], self.forced[np.arange(self.rows), at], -1)
        rows = np.flatnonzero(token >= 0)
        if len(rows) and "logits" in step:
            step["logits"][rows] = -np.inf
            step["logits"][rows, token[rows]] = 0.0
        if len(rows) and "top_ids" in step:
            step["top_logits"][rows] = -np.inf
            step["top_logits"][rows, 0] = 0.0
            step["top_ids"][rows, 0] = token[rows]
            step["log_norm"][rows] = 0.0
        self.forced_at += 1
        if (self.forced_at >= self.forced.shape[1]).all():  # every row is past its forced tokens
            self.forced = np.full((self.rows, 0), -1, np.int64)
    def step(self) -> list[tuple[object, list[Hypothesis]]]:
        """One decoder step for every row; the sentences done at it, with their hypotheses."""
        out = self.search_step()
        self.forcing(out)
        finished, freed, faults = [], [], []
        origin = None
        for key, g in list(self.groups.items()):
            try:
                done, tokens, local_origin = g.advance(out)
            except Exception as exc:
                if self.on_fault is None:
                    raise
                faults.append((key, exc, None))  # it leaves after the others have moved their rows
                continue
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
                g.close()
                del self.groups[key]
        try:
            if origin is not None:
                self.session.reorder(origin, cache_only=True)  # beams trade places within their sentence
                self.forced, self.forced_at = self.forced[origin], self.forced_at[origin]
            if freed:
                self.release(np.concatenate(freed))
            self.faulted(faults)
        except Exception as exc:  # the session's: the sentences done at this step are whole all the same
            self.broken = exc
        return finished

    def search_step(self) -> dict[str, np.ndarray]:
        """One decoder step: the full logits only if a group needs them (or the session gives nothing else)."""
        width = getattr(self.session, "search_width", 0)
        if not width:  # a session of logits only
            return {"logits": self.session.step(self.tokens[:, None])}
        need = any(g.needs_logits(width) for g in self.groups.values())
        out = self.session.search_step(self.tokens[:, None], need)
        return out if need else {name: out[name] for name in ("top_logits", "top_ids", "log_norm")}

    def compact(self) -> None:
        """Once more than compact_at of the rows are free, move the others together (group by group)."""
        if not self.groups:
            self.rows, self.free, self.tokens = 0, [], np.zeros(0, np.int64)  # the next add starts afresh
            self.forced, self.forced_at = np.full((0, 0), -1, np.int64), np.zeros(0, np.int64)
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
        self.forced, self.forced_at = self.forced[origin], self.forced_at[origin]


def decode(session: StepSession, sources: Sequence[Sequence[int]], options: DecodeOptions, *, specials: Specials,
           max_new_tokens: int, limits: Sequence[int] | None = None, group: type[Group] | None = None,
           prefixes: Sequence[Sequence[int]] | None = None,
           constraints: Sequence[Constraints | None] | None = None) -> list[list[Hypothesis]]:
    """Every sentence decoded together, start to end: n-best hypotheses each (greedy and sampling give one
    with score 0). `limits`: each sentence's max_new_tokens (default: all max_new_tokens); `prefixes`: each
    sentence's forced tokens after the start token (Entry.prefix); `constraints`: each sentence's (None:
    none; Entry.constraints). One decode at a time per session (SessionBusy otherwise)."""
    results: list[list[Hypothesis]] = [[] for _ in sources]
    for finished, _ in decode_steps(session, sources, options, specials=specials, max_new_tokens=max_new_tokens,
                                    limits=limits, group=group, prefixes=prefixes, constraints=constraints):
        for i, hyps in finished:
            results[i] = hyps
    return results


def decode_steps(session: StepSession, sources: Sequence[Sequence[int]], options: DecodeOptions, *,
                 specials: Specials, max_new_tokens: int, limits: Sequence[int] | None = None,
                 group: type[Group] | None = None, prefixes: Sequence[Sequence[int]] | None = None,
                 stream: bool = False,
                 constraints: Sequence[Constraints | None] | None = None) -> Iterator[tuple[list, list]]:
    """`decode`, one step at a time: after each step (and once before the first), the sentences done at it
    (index, n-best hypotheses) and, if `stream`, the tokens so far of those still decoding with greedy search or
    sampling (index, tokens: RunningBatch.progress). The session is claimed until the iterator ends or is
    closed."""
    if not sources:
        raise BadInput("empty input: every sentence needs at least one token")
    limits = [max_new_tokens] * len(sources) if limits is None else list(limits)
    prefixes = [()] * len(sources) if prefixes is None else prefixes
    constraints = [None] * len(sources) if constraints is None else constraints
    with session.claimed():
        batch = RunningBatch(session, specials=specials)
        finished = batch.add([Entry(s, options, limit, i, group, prefix, stream, constraints=c)
                              for i, (s, limit, prefix, c) in enumerate(zip(sources, limits, prefixes, constraints))])
        while True:
            yield finished, batch.progress() if batch.streaming else []
            if not batch.sentences:
                return
            finished = batch.step()
            if batch.broken is not None:
                raise batch.broken
