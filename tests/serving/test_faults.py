"""Fault isolation in the batching engine (twostep/serving/engine.py, runtime/decoding/batch.py): a request whose
decode raises fails alone, and the requests it shared a batch with answer what they answer alone, in flight,
static and in the express lane, plain and streamed; nobody is left waiting. Real ONNX Runtime sessions; the
faults are injected: a search group that raises on a poison source (a bug in the search, or an option whose
arithmetic breaks), and a step session that raises while a row holds one (the model's session: which sentence
made it raise cannot be told)."""

from __future__ import annotations

import contextlib
import queue
import time

import numpy as np
import pytest

from fault_helpers import Poisoned, group_poison
from twostep.artifact import load_artifact
from twostep.runtime import backends
from twostep.runtime.decoding import DecodeOptions
from twostep.runtime.decoding.batch import Entry, RunningBatch, decode
from twostep.runtime.decoding.options import Specials
from twostep.runtime.streaming import Delta, SentenceDone
from twostep.runtime.tokenizer import Tokenizer
from twostep.runtime.translator import Limits, Translator
from twostep.serving.engine import Faulted, Metrics
from twostep.serving.executor import BatchingTranslator
from twostep.serving.limits import BatchLimits

LANES = {"in-flight": dict(), "static": dict(inflight=False), "express": dict(express_tokens=11)}
OPTIONS = {"greedy": DecodeOptions(), "beam4": DecodeOptions(beam_size=4, n_best=2),
           "sampling": DecodeOptions(sampling=True, temperature=0.7, top_k=5, seed=11)}


class Faults(Metrics):
    def __init__(self):
        self.faults = []

    def fault(self, where, sentences, retried):
        self.faults.append((where, sentences, retried))


@pytest.fixture(scope="module")
def demo(demo_artifact):
    artifact = load_artifact(demo_artifact)
    with backends.create("ort-cpu", artifact=artifact, threads=2) as backend:
        yield artifact, backend


@pytest.fixture(scope="module")
def good() -> list[list[str]]:
    """Eight requests of one to three sentences of the demo model's test split."""
    from twostep.model.tasks import get_task

    sentences = [source for source, _ in get_task("numbers-en-de").split("test")]
    sizes = [1, 2, 3, 1, 2, 1, 3, 1]
    starts = np.cumsum([0, *sizes])
    return [sentences[a:b] for a, b in zip(starts, starts[1:])]


@pytest.fixture(scope="module")
def poison(demo, good) -> int:
    """A source token that no good request has."""
    artifact, _ = demo
    tokenizer = Tokenizer.load(artifact.path, artifact.tokenizer)
    used = {t for texts in good for text in texts for t in tokenizer.encode_source(text)}
    return next(t for t in range(4, artifact.config.src_vocab_size) if t not in used)


def make(demo, session_wrapper=lambda s: s, **limits) -> tuple[BatchingTranslator, Faults]:
    artifact, backend = demo
    metrics = Faults()
    express = session_wrapper(backend.session()) if limits.get("express_tokens") else None
    ex = BatchingTranslator(session_wrapper(backend.session()), Limits.of(artifact.config),
                            Tokenizer.load(artifact.path, artifact.tokenizer),
                            limits=BatchLimits(max_wait_ms=200, **limits), metrics=metrics, express_session=express)
    return ex, metrics


def alone(demo, requests, options) -> list:
    """Each request alone through the plain Translator: what each must get, as texts_of gives it."""
    artifact, backend = demo
    plain = Translator(backend.session(), Limits.of(artifact.config), Tokenizer.load(artifact.path, artifact.tokenizer))
    return [[[(t, round(s, 4)) for t, s in hyps] for hyps in plain.translate_nbest(texts, options)]
            for texts in requests]


def texts_of(ex, results) -> list:
    return [[(ex.tokenizer.decode(h.tokens), round(h.score, 4)) for h in hyps] for hyps in results]


def submit_all(ex, good, poison_ids, options) -> tuple[list, object]:
    """The good requests and one poison request (a good sentence and a poison one), submitted at once."""
    futures = [ex.submit_ids(ex.encode(texts), options) for texts in good[:4]]
    bad = ex.submit_ids([ex.encode(good[0])[0], poison_ids], options)
    futures += [ex.submit_ids(ex.encode(texts), options) for texts in good[4:]]
    return futures, bad


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize("name", OPTIONS)
def test_a_search_group_that_raises_fails_only_its_own_request(demo, good, poison, lane, name):
    options = OPTIONS[name]
    ex, metrics = make(demo, **LANES[lane])
    with group_poison(poison), ex:
        futures, bad = submit_all(ex, good, [poison, poison, 3], options)
        answers = [texts_of(ex, f.result(60)) for f in futures]
        with pytest.raises(Faulted, match="OverflowError"):
            bad.result(60)
    assert answers == alone(demo, good, options)
    # the poison shared its group with good sentences: they decoded again, alone, before anyone failed
    assert metrics.faults and metrics.faults[0][0] == "search" and metrics.faults[0][2] > 0, metrics.faults
    assert all(where == "search" for where, _, _ in metrics.faults)


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize("where", ["step", "encode"])
def test_a_session_that_raises_is_retried_in_halves_until_the_sentence_that_raises_fails_alone(
        demo, good, poison, lane, where):
    options = OPTIONS["greedy"]
    ex, metrics = make(demo, lambda s: Poisoned(s, poison, where), **LANES[lane])
    with ex:
        futures, bad = submit_all(ex, good, [poison, 3], options)
        answers = [texts_of(ex, f.result(60)) for f in futures]
        with pytest.raises(Faulted, match="RUNTIME_EXCEPTION"):
            bad.result(60)
    assert answers == alone(demo, good, options)
    sessions = [f for f in metrics.faults if f[0] == "session"]
    assert sessions and sessions[0][1] > 1 and sessions[0][2] == sessions[0][1], metrics.faults
    assert sessions[-1][1:] == (1, 0)  # the last: the poison alone, failed


@pytest.mark.parametrize("name", ["greedy", "beam4"])
def test_sentences_done_at_a_step_whose_session_then_raises_are_answered(demo, good, name):
    """The session raises once, freeing the rows of the sentences done at a step: those sentences are answered
    (nothing lost), the others decode again."""
    options = OPTIONS[name]
    ex, metrics = make(demo, lambda s: Poisoned(s, -1, "release", once=True))
    with ex:
        futures = [ex.submit_ids(ex.encode(texts), options) for texts in good]
        answers = [texts_of(ex, f.result(60)) for f in futures]
    assert answers == alone(demo, good, options)
    assert [f[0] for f in metrics.faults] == ["session"]


def test_a_session_that_raises_freeing_a_faulty_groups_rows_as_it_joins_decodes_each_sentence_once(
        demo, good, poison):
    """A group raises as the poison joins it, and the session raises freeing that group's rows: the batch is lost
    with the sentences that had joined it at that moment, the group's among them; each decodes again once, in
    the session's cohorts, and answers once, and the poison's group raises again there, alone."""
    options = OPTIONS["greedy"]
    ex, metrics = make(demo, lambda s: Poisoned(s, -1, "release", once=True))
    with group_poison(poison, "join"), ex:
        futures, bad = submit_all(ex, good, [poison, 3], options)
        answers = [texts_of(ex, f.result(60)) for f in futures]
        with pytest.raises(Faulted):
            bad.result(60)
    assert answers == alone(demo, good, options)
    assert [f[0] for f in metrics.faults][:2] == ["session", "search"], metrics.faults


@pytest.mark.parametrize("lane", LANES)
def test_a_session_that_always_raises_fails_every_request_and_leaves_none_waiting(demo, good, lane):
    ex, metrics = make(demo, AlwaysRaises, **LANES[lane])
    started = time.monotonic()
    with ex:
        futures = [ex.submit_ids(ex.encode(texts)) for texts in good]
        outcomes = [f.exception(60) for f in futures]
    assert all(isinstance(o, Faulted) for o in outcomes), outcomes
    assert time.monotonic() - started < 60
    sentences = sum(map(len, good))
    assert sum(1 for f in metrics.faults if f[2] == 0) <= sentences  # each fails alone once, at most
    assert len(metrics.faults) < 4 * sentences


class AlwaysRaises(Poisoned):
    def __init__(self, inner):
        super().__init__(inner, -1)

    def check(self, where: str, any_row: bool = False) -> None:
        if where == "step":
            raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : injected in step")


def streamed(ex, sources, poison_ids=None) -> tuple[list, object]:
    """Streams of `sources`, one each, and a poison one among them (if given), submitted at once; each stream's
    events as a consumer that keeps up sees them, and the poison's future."""
    queues = [queue.SimpleQueue() for _ in sources]
    streams = [ex.submit_stream([ids], None, None, q.put) for ids, q in zip(sources[:3], queues)]
    bad = ex.submit_stream([poison_ids], None, None, lambda item: None)[0] if poison_ids else None
    streams += [ex.submit_stream([ids], None, None, q.put) for ids, q in zip(sources[3:], queues[3:])]
    out = []
    for (future, events), q in zip(streams, queues):
        got = []
        while (item := q.get(timeout=60)) is not None:
            got += ex.events(events, [item])
        future.result(60)
        out.append(got)
    return out, bad


@pytest.mark.parametrize("fault", ["search", "session"])
def test_a_poison_stream_ends_with_its_error_and_the_others_stream_as_alone(demo, good, poison, fault):
    wrap = (lambda s: Poisoned(s, poison)) if fault == "session" else (lambda s: s)
    ex, _ = make(demo, wrap)
    texts = [t for texts in good for t in texts][:6]
    with group_poison(poison) if fault == "search" else contextlib.nullcontext(), ex:
        sources = ex.encode(texts)
        want = [streamed(ex, [ids])[0][0] for ids in sources]  # alone, one at a time
        got, bad = streamed(ex, sources, [poison, *sources[0]])
        with pytest.raises(Faulted):
            bad.result(60)
    assert [[e for e in events if isinstance(e, SentenceDone)] for events in got] == \
           [[e for e in events if isinstance(e, SentenceDone)] for events in want]
    assert ["".join(e.text for e in events if isinstance(e, Delta)) for events in got] == \
           ["".join(e.text for e in events if isinstance(e, Delta)) for events in want]
    assert all(any(isinstance(e, Delta) for e in events) for events in got)


def test_without_on_fault_a_running_batch_raises_what_its_group_raised(demo, poison):
    """The static decode (the CLI's, the plain Translator's: one caller) gets the exception itself."""
    artifact, backend = demo
    with group_poison(poison), pytest.raises(OverflowError):
        decode(backend.session(), [[5, 3], [poison, 3]], DecodeOptions(), specials=Specials.of(artifact.config),
               max_new_tokens=8)


def test_a_group_that_raises_leaves_the_batch_and_the_others_go_on(demo, poison):
    artifact, backend = demo
    told = []
    session = backend.session()
    with group_poison(poison), session.claimed():
        batch = RunningBatch(session, specials=Specials.of(artifact.config), on_fault=lambda o, e: told.append((o, e)))
        batch.add([Entry([5, 6, 3], DecodeOptions(suppress_eos=True), 8, "good"),
                   Entry([poison, 3], DecodeOptions(beam_size=2), 8, "bad"),
                   Entry([7, 3], DecodeOptions(beam_size=2), 8, "innocent")])
        done = batch.step()  # the beam group raises: its four rows are freed at once, the good one's row goes on
        assert told and batch.live_rows == 1
        while batch.sentences:
            done += batch.step()
    assert [(o, type(e)) for o, e in told] == [(["bad", "innocent"], OverflowError)]
    assert [owner for owner, _ in done] == ["good"]
    assert batch.rows == 0 and batch.broken is None


def test_an_unseeded_sampling_stream_that_has_streamed_fails_rather_than_restart(demo, good, poison):
    """Decoding again would draw another sample than the one it has streamed: that stream fails with the fault,
    while a seeded one and greedy ones decode again and stream as they would have."""
    ex, metrics = make(demo, lambda s: Poisoned(s, poison, step_s=0.01))  # 100 steps: a second
    texts = [t for texts in good for t in texts][:3]
    long = dict(suppress_eos=True, max_new_tokens=100)
    options = [DecodeOptions(sampling=True, **long), DecodeOptions(sampling=True, seed=3, **long),
               DecodeOptions(**long)]
    with ex:
        sources = ex.encode(texts)
        queues = [queue.SimpleQueue() for _ in sources]
        streams = [ex.submit_stream([ids], o, None, q.put) for ids, o, q in zip(sources, options, queues)]
        for q in queues:  # each has streamed a token
            assert q.get(timeout=60)[0] == "tokens"
        bad = ex.submit_ids([[poison, *sources[0]]])
        with pytest.raises(Faulted):
            bad.result(60)
        with pytest.raises(Faulted):
            streams[0][0].result(60)
        assert [len(f.result(60)) for f, _ in streams[1:]] == [1, 1]
    assert metrics.faults[0][0] == "session" and metrics.faults[0][1] - metrics.faults[0][2] == 1
