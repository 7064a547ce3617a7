"""Lexical constraints: the target terms a sentence's output must contain (a glossary's, issue 50), as token ids,
and the automaton that constrained beam search (search.ConstrainedBeam) advances one token at a time.

A sentence's `Constraints` are terms, each a set of token sequences of which any one must appear, contiguous,
somewhere in the output (unordered: in any order, anywhere): every variant of the term in every tokenization the
target tokenizer gives it in context. What a hypothesis has met is what its tokens hold, whatever it meant to write.

`Automaton` is Aho-Corasick over those sequences (token ids for characters): its state after a hypothesis' tokens
is the longest suffix of them that begins some sequence, so that one transition per token tells which terms are
met (`done`), how far the hypothesis is inside a sequence of a term it has not met (`inside`), and which tokens
take it further into one (`ahead`). `Table` holds the automata of a search group's sentences side by side in flat
arrays, so that a step advances every row at once.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from twostep.errors import BadInput

MAX_TERMS = 32  # of one sentence; the rest are reported unmet (a bit each in an int64 mask)
KEY = 1 << 32  # state * KEY + token: a transition's key, for any vocabulary


@dataclass(frozen=True)
class Constraints:
    """A sentence's terms: terms[i] is the token sequences of which one must appear in its output."""

    terms: tuple[tuple[tuple[int, ...], ...], ...]

    def __post_init__(self) -> None:
        if len(self.terms) > MAX_TERMS:
            raise BadInput(f"a sentence takes at most {MAX_TERMS} terms, got {len(self.terms)}")
        for term in self.terms:
            if not term or any(not sequence for sequence in term):
                raise BadInput("a constraint term needs at least one sequence of at least one token")

    @classmethod
    def of(cls, terms: Sequence[Sequence[Sequence[int]]]) -> Constraints:
        return cls(tuple(tuple(dict.fromkeys(tuple(int(t) for t in s) for s in term)) for term in terms))

    @property
    def every(self) -> int:
        """The mask of every term met."""
        return (1 << len(self.terms)) - 1

    @property
    def length(self) -> int:
        """The tokens the longest way of meeting every term takes: what a sentence's limit grows by."""
        return sum(max(len(s) for s in term) for term in self.terms)


class Automaton:
    """Aho-Corasick over a sentence's term sequences: state 0 is the root (nothing begun). Per state: `done`, the
    mask of the terms some sequence of which ends here or at a shorter suffix; `inside`, (depth, mask) for the
    state and each shorter suffix of it but the root that is a proper prefix of some sequences, the mask their
    terms; `ahead`, (token, mask) for every token that extends the state or one of its suffixes along a sequence,
    the mask the terms of those sequences; `step`, the transitions that leave the root's grip (any other token
    returns to the root)."""

    def __init__(self, constraints: Constraints):
        children: list[dict[int, int]] = [{}]
        through = [0]  # terms with a sequence passing through (or ending at) the node
        ends, proper = [0], [0]  # terms with a sequence ending at the node; with the node as a proper prefix
        for i, term in enumerate(constraints.terms):
            for sequence in term:
                node = 0
                for token in sequence:
                    if token not in children[node]:
                        children[node][token] = len(children)
                        children.append({}), through.append(0), ends.append(0), proper.append(0)
                    proper[node] |= 1 << i if node else 0
                    node = children[node][token]
                    through[node] |= 1 << i
                ends[node] |= 1 << i
        fail = [0] * len(children)
        order = deque(children[0].values())
        breadth = []
        while order:
            node = order.popleft()
            breadth.append(node)
            for token, child in children[node].items():
                f = fail[node]
                while f and token not in children[f]:
                    f = fail[f]
                fail[child] = children[f][token] if token in children[f] and children[f][token] != child else 0
                order.append(child)
        depth = [0] * len(children)
        for node in [0, *breadth]:
            for child in children[node].values():
                depth[child] = depth[node] + 1
        self.done = list(ends)
        self.inside: list[list[tuple[int, int]]] = [[] for _ in children]
        for node in breadth:  # shorter before longer: a suffix's are final before they are added
            self.done[node] |= self.done[fail[node]]
            self.inside[node] = ([(depth[node], proper[node])] if proper[node] else []) + self.inside[fail[node]]
        self.ahead: list[dict[int, int]] = []
        self.step: dict[tuple[int, int], int] = {}
        for node in range(len(children)):
            ahead: dict[int, int] = {}
            suffix = node
            while True:  # the node and its suffixes, longest first: a token's transition is the longest's
                for token, child in children[suffix].items():
                    if token not in ahead:
                        ahead[token] = 0
                        self.step[node, token] = child
                    ahead[token] |= through[child]
                if not suffix:
                    break
                suffix = fail[suffix]
            self.ahead.append(ahead)
        self.states = len(children)
        self.arrays()

    def arrays(self) -> None:
        """The automaton as the flat arrays a Table joins (made once: automata are cached, `compiled`)."""
        keys = np.array([s * KEY + t for s, t in self.step], np.int64)
        order = np.argsort(keys, kind="stable")
        self.keys, self.targets = keys[order], np.array(list(self.step.values()), np.int64)[order]
        self.done_array = np.array(self.done, np.int64)
        width = max((len(chain) for chain in self.inside), default=0)
        self.inside_depth = np.zeros((self.states, width), np.int64)
        self.inside_mask = np.zeros((self.states, width), np.int64)
        for state, chain in enumerate(self.inside):
            if chain:
                self.inside_depth[state, : len(chain)], self.inside_mask[state, : len(chain)] = zip(*chain)
        self.ahead_start = np.concatenate([[0], np.cumsum([len(a) for a in self.ahead])]).astype(np.int64)
        self.ahead_tokens = np.array([t for a in self.ahead for t in a], np.int64)
        self.ahead_masks = np.array([m for a in self.ahead for m in a.values()], np.int64)


@functools.lru_cache(maxsize=4096)
def compiled(constraints: Constraints) -> Automaton:
    """A sentence's automaton, made once for the same constraints (a glossary's term gives the same to every
    sentence that holds it)."""
    return Automaton(constraints)


class Table:
    """The automata of a group's sentences side by side: sentence j's states are offset[j] .. offset[j+1] - 1, its
    root offset[j]. A transition (state, token) is found in `keys` (sorted state * KEY + token) by a binary search,
    and a token without one returns to the state's root."""

    def __init__(self, automata: Sequence[Automaton]):
        sizes = np.array([a.states for a in automata], np.int64)
        self.offset = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        base = self.offset[:-1]
        self.root = np.repeat(base, sizes)
        self.done = np.concatenate([np.zeros(0, np.int64), *(a.done_array for a in automata)])
        width = max((a.inside_depth.shape[1] for a in automata), default=0)
        self.inside_depth = np.zeros((len(self.root), width), np.int64)
        self.inside_mask = np.zeros((len(self.root), width), np.int64)
        for a, at in zip(automata, base):
            w = a.inside_depth.shape[1]
            self.inside_depth[at : at + a.states, :w], self.inside_mask[at : at + a.states, :w] = \
                a.inside_depth, a.inside_mask
        # each automaton's keys are sorted and its states above the one's before: the joined keys are sorted
        self.keys = np.concatenate([np.zeros(0, np.int64), *(a.keys + at * KEY for a, at in zip(automata, base))])
        self.targets = np.concatenate([np.zeros(0, np.int64), *(a.targets + at for a, at in zip(automata, base))])
        counts = np.array([len(a.ahead_tokens) for a in automata], np.int64)
        before = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.ahead_start = np.concatenate([*(a.ahead_start[:-1] + b for a, b in zip(automata, before)),
                                           before[-1:]]).astype(np.int64)
        self.ahead_tokens = np.concatenate([np.zeros(0, np.int64), *(a.ahead_tokens for a in automata)])
        self.ahead_masks = np.concatenate([np.zeros(0, np.int64), *(a.ahead_masks for a in automata)])

    def advance(self, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Each state after its token."""
        keys = states * KEY + tokens
        at = np.minimum(np.searchsorted(self.keys, keys), max(len(self.keys) - 1, 0))
        found = self.keys[at] == keys if len(self.keys) else np.zeros(len(keys), bool)
        return np.where(found, self.targets[at] if len(self.keys) else 0, self.root[states])

    def depth(self, states: np.ndarray, met: np.ndarray) -> np.ndarray:
        """How far each state is inside a sequence of a term its hypothesis has not met (`met`: its mask): the
        longest of its suffixes that is a proper prefix of one, in tokens; 0: none."""
        open_ = (self.inside_mask[states] & ~met[:, None]) != 0
        return (self.inside_depth[states] * open_).max(axis=1, initial=0)

    def tokens_ahead(self, states: np.ndarray, met: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index into states, token) of every token that takes a state further along a sequence of a term its
        hypothesis has not met (`met`: its mask)."""
        start, stop = self.ahead_start[states], self.ahead_start[states + 1]
        count = stop - start
        which = np.repeat(np.arange(len(states)), count)
        at = np.repeat(start - np.concatenate([[0], np.cumsum(count)[:-1]]), count) + np.arange(int(count.sum()))
        useful = (self.ahead_masks[at] & ~met[which]) != 0
        return which[useful], self.ahead_tokens[at[useful]]
