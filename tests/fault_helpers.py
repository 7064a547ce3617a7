"""Faults injected into decoding, for the fault-isolation tests (tests/serving/test_faults.py, test_poison.py):
a step session that raises while one of its rows holds a poison source (`Poisoned`: the model's session, which
cannot say which sentence made it raise), and search groups that raise while they hold one (`group_poison`: a bug
in the search, or an option whose arithmetic breaks). A server process, and Ray Serve's replicas, get either from
the environment: with tests/poison_site on PYTHONPATH, its sitecustomize calls `from_environment()`, which reads
TWOSTEP_TEST_POISON (a source token id) and TWOSTEP_TEST_POISON_IN (search, the default, or session)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import numpy as np

from twostep.runtime.decoding import search
from twostep.runtime.decoding.batch import RunningBatch

TESTS = Path(__file__).parent
POISON_SITE = f"{TESTS / 'poison_site'}:{TESTS}"  # PYTHONPATH: its sitecustomize injects the fault the env names

class Poisoned:
    """A step session that raises, as a model's session may, in `where` ("step", "encode" or "release") while one
    of its rows holds a source with the token `poison` (and, with `once`, only the first time). It follows the
    rows from the calls the batch makes, as a session does."""

    def __init__(self, inner, poison: int, where: str = "step", once: bool = False, step_s: float = 0.0):
        self.inner, self.poison, self.where, self.once, self.step_s = inner, poison, where, once, step_s
        self.held = np.zeros(0, bool)  # each row: holds a poison source
        self.raised = 0

    def __getattr__(self, name):  # search_width, and whatever else the session has
        return getattr(self.inner, name)

    def check(self, where: str, any_row: bool = False) -> None:
        if where == self.where and (any_row or self.held.any()) and not (self.once and self.raised):
            self.raised += 1
            raise RuntimeError(f"[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : injected in {where}")

    def claimed(self):
        return self.inner.claimed()

    def start(self, input_ids, attention_mask):
        self.inner.start(input_ids, attention_mask)
        self.held = (input_ids == self.poison).any(1)
        self.check("encode")

    def admit(self, input_ids, attention_mask, sources, rows):
        self.inner.admit(input_ids, attention_mask, sources, rows)
        self.held = np.concatenate([self.held, np.zeros(max(rows.max() + 1 - len(self.held), 0), bool)])
        self.held[rows] = (input_ids == self.poison).any(1)[sources]
        self.check("encode")

    def release(self, rows):
        self.check("release", any_row=self.poison < 0)
        self.inner.release(rows)
        self.held[rows] = False

    def reorder(self, origin, cache_only=False):
        self.inner.reorder(origin, cache_only)
        self.held = self.held[origin]

    def step(self, input_ids):
        self.check("step")
        time.sleep(self.step_s)
        return self.inner.step(input_ids)

    def search_step(self, input_ids, need_logits=True):
        self.check("step")
        time.sleep(self.step_s)
        return self.inner.search_step(input_ids, need_logits)


@contextlib.contextmanager
def group_poison(poison: int, where: str = "step"):
    """Every search group raises in its step (`where`; "join": as such a sentence joins it) while it holds a
    sentence whose source has `poison` (as a search would whose arithmetic breaks on one sentence's options or
    tokens)."""
    original_join, original_advance = search.Group.join, {c: c.advance for c in (search.Greedy, search.Beam)}

    def join(self, sources, limits, owners, *args, **kwargs):
        self.poisoned = [*getattr(self, "poisoned", []), *(o for s, o in zip(sources, owners) if poison in s)]
        out = original_join(self, sources, limits, owners, *args, **kwargs)
        if where == "join" and any(poison in s for s in sources):
            raise OverflowError("(34, 'Numerical result out of range')")
        return out

    def advancing(cls):
        def advance(self, step):
            if where == "step" and any(owner is p for owner in self.owners for p in self.poisoned):
                raise OverflowError("(34, 'Numerical result out of range')")
            return original_advance[cls](self, step)
        return advance

    search.Group.join = join
    for cls in original_advance:
        cls.advance = advancing(cls)
    try:
        yield
    finally:
        search.Group.join = original_join
        for cls, method in original_advance.items():
            cls.advance = method



@contextlib.contextmanager
def session_poison(poison: int):
    """Every running batch's step session raises in its steps while a row holds a source with `poison`."""
    original = RunningBatch.__init__

    def init(self, session, **kwargs):
        original(self, Poisoned(session, poison), **kwargs)

    RunningBatch.__init__ = init
    try:
        yield
    finally:
        RunningBatch.__init__ = original


def poison_word(artifact_dir, texts: list[str]) -> tuple[str, int]:
    """A word of the demo model's that is one source token, which none of `texts` has: (the word, its token)."""
    from twostep.artifact import load_artifact
    from twostep.runtime.tokenizer import Tokenizer

    artifact = load_artifact(artifact_dir)
    tokenizer = Tokenizer.load(artifact.path, artifact.tokenizer)
    used = {t for text in texts for t in tokenizer.encode_source(text)}
    for word in ("thirteen", "fourteen", "seventeen", "eighteen", "nineteen", "eleven", "twelve", "million"):
        ids = tokenizer.encode_source(word)[:-1]  # without eos
        if len(ids) == 1 and ids[0] not in used:
            return word, ids[0]
    raise AssertionError("no word of the demo model's vocabulary is missing from the texts")


def from_environment() -> None:
    """The fault the environment names, for the rest of the process (nothing without TWOSTEP_TEST_POISON)."""
    if not os.environ.get("TWOSTEP_TEST_POISON"):
        return
    poison = int(os.environ["TWOSTEP_TEST_POISON"])
    where = os.environ.get("TWOSTEP_TEST_POISON_IN", "search")
    INSTALLED.append((group_poison if where == "search" else session_poison)(poison))
    INSTALLED[-1].__enter__()  # held: a context manager collected would undo it


INSTALLED: list = []
