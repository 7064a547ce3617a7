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


class Table:
    """The automata of a group's sentences side by side: sentence j's states are offset[j] .. offset[j+1] - 1, its
    root offset[j]. A transition (state, token) is found in `keys` (sorted state * KEY + token) by a binary search,
    and a token without one returns to the state's root."""

    def __init__(self, automata: Sequence[Automaton]):
        sizes = np.array([a.states for a in automata], np.int64)
        self.offset = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.root = np.repeat(self.offset[:-1], sizes)
        self.done = np.array([m for a in automata for m in a.done], np.int64)
        inside = [chain for a in automata for chain in a.inside]
        width = max((len(chain) for chain in inside), default=0)
        self.inside_depth = np.zeros((len(inside), width), np.int64)
        self.inside_mask = np.zeros((len(inside), width), np.int64)
        for state, chain in enumerate(inside):
            if chain:
                self.inside_depth[state, : len(chain)], self.inside_mask[state, : len(chain)] = zip(*chain)
        keys, targets, counts, tokens, masks = [], [], [], [], []
        for a, base in zip(automata, self.offset):
            keys += [(base + s) * KEY + t for s, t in a.step]
            targets += [base + c for c in a.step.values()]
            for ahead in a.ahead:
                counts.append(len(ahead))
                tokens += ahead.keys()
                masks += ahead.values()
        order = np.argsort(np.array(keys, np.int64), kind="stable")
        self.keys = np.array(keys, np.int64)[order]
        self.targets = np.array(targets, np.int64)[order]
        self.ahead_start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.ahead_tokens = np.array(tokens, np.int64)
        self.ahead_masks = np.array(masks, np.int64)

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


def popcount(masks: np.ndarray) -> np.ndarray:
    """The terms met of each mask."""
    out = np.zeros(masks.shape, np.int64)
    masks = masks.copy()
    while masks.any():
        out += masks & 1
        masks >>= 1
    return out
