"""Many callers, one model: the batching engine over any backend's step session.

The `BatchingEngine` owns the queue, the lanes, the worker thread and the metrics, and knows token ids only (the
front that callers use, with text and each request's checks, is twostep.serving.executor.BatchingTranslator).
Its worker starts with `start()` (or `with`), not when it is made. Checked sentences wait in one bounded queue;
the worker decodes them in one running batch (decoding.RunningBatch):

- In-flight batching (the default): at every step boundary, the sentences waiting in the queue join the
  running batch, in arrival order, as long as it holds at most `max_batch_tokens` source tokens x beam and
  `max_batch_rows` rows. Their encoder runs for them alone; they take the rows that finished sentences freed
  (or new rows) with an empty history and decode next to sentences that are further on. A sentence that
  arrives while a batch decodes waits at most one decoder step, not for the batch to end.
- Static batching (`inflight=False`): a batch takes what fits and runs until its last sentence is done;
  sentences that arrive meanwhile wait for the next batch.

- The express lane (in flight, `express_tokens` > 0): sentences of at most `express_tokens` source tokens
  decode in a second running batch, on a step session of their own, while it holds at most `express_rows`
  rows (beyond that they join the main batch). While both batches run, the worker steps the express one
  first, giving the main one at least 1 - `express_share` of its time: a short sentence decodes at close
  to its speed alone instead of at the pace of a step over every long sentence, and long sentences go on
  meanwhile. It costs throughput (a step of a few rows does less work per second than the same rows in the
  big step): docs/benchmarks.md measures it.

Either way a batch starts once its first sentence has waited `max_wait_ms` after it came or after the worker
became free (whichever is later), or sooner once the batch is full or as many requests wait as the worker answered
since it was last free (its callers are back: one client alone never waits); sentences decoded with different options
share it (each decodes with its own). A sentence that finishes leaves the batch at that step (its rows are
freed for the next to join) and its request is answered as soon as its last sentence is done; a request
whose caller went away (a cancelled future) has its rows freed the same way. A full queue refuses at once
with `Overloaded`.

A sentence with constraints (a glossary's terms: `submit(..., constraints=)`) decodes with constrained beam search
(decoding.search.ConstrainedBeam) in a search group of its own kind, taking that search's rows (at least 4) in the
lane's budgets; the sentences beside it decode as without it.

Each sentence decodes as if alone: its own max_new_tokens (2 x its length + 16, or the request's), sampling
seeded per sentence, and rows computed without regard to their neighbours, so outputs do not depend on what
else shares the batch, or on when a sentence joined it.

A request may stream: `submit(..., on_tokens=, on_sentence=)` hears, in the worker thread, each greedy or
sampling sentence's tokens so far after every step (RunningBatch.progress; asked only while a sentence that
streams decodes) and each sentence as it is done. A callback that raises fails its own request only.

Imports no web framework: `twostep.serving.http` and `twostep.serving.ray_app` serve it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field, replace

from twostep.errors import BadInput, Overloaded, TwostepError
from twostep.runtime.decoding import DecodeOptions, Entry, Hypothesis, RunningBatch, Specials, StepSession
from twostep.runtime.decoding.constraints import Constraints
from twostep.runtime.decoding.search import ConstrainedBeam
from twostep.serving.limits import BatchLimits

log = logging.getLogger("twostep.serving")


class Faulted(RuntimeError):
    """A request's decode raised (a bug, or a model that cannot decode the request), in its own search group or
    alone on the session: the request fails with this, and the sentences it shared a batch with go on."""

    def __init__(self, cause: Exception):
        super().__init__(f"decoding this request failed: {type(cause).__name__}: {cause}")
        self.cause = cause


class Metrics:
    """What the executor reports; the HTTP server's Prometheus metrics subclass it. This one counts nothing."""

    def batch(self, sentences: int, rows: int) -> None:
        """A batch started decoding with these sentences and rows."""

    def joined(self, sentences: int, rows: int) -> None:
        """Sentences joined a running batch."""

    def step(self, rows: int, express: bool = False) -> None:
        """A decoder step ran for this many rows of sentences (free rows not counted), in the express lane's
        batch or the main one."""

    def generated(self, tokens: int) -> None:
        """A sentence finished with this many tokens (its best hypothesis)."""

    def fault(self, where: str, sentences: int, retried: int) -> None:
        """Decoding raised: in a search group (`where` "search": its sentences' own fault) or in the step session
        ("session": the lane's), with this many sentences decoding in it, of which `retried` decode again."""


OnTokens = Callable[[int, list[int]], None]  # (sentence index, its tokens so far)
OnSentence = Callable[[int, list[Hypothesis]], None]  # (sentence index, its n-best hypotheses)


@dataclass(eq=False)
class Request:
    sources: list[list[int]]
    options: DecodeOptions
    prefix: tuple[int, ...] = ()  # forced after the decoder's start: the target language's token
    on_tokens: OnTokens | None = None
    on_sentence: OnSentence | None = None
    constraints: list[Constraints | None] | None = None  # each sentence's (a glossary's terms); None: none
    future: Future = field(default_factory=Future)
    results: list = field(init=False)
    remaining: int = field(init=False)
    key: DecodeOptions = field(init=False)  # the options a sentence decodes with; max_new_tokens is its limit

    def __post_init__(self) -> None:
        self.results, self.remaining = [[] for _ in self.sources], len(self.sources)
        self.key = replace(self.options, max_new_tokens=None)


@dataclass(eq=False)
class Sentence:
    request: Request
    index: int  # in its request
    ids: list[int]
    limit: int  # its max_new_tokens
    arrived: float
    alone: bool = False  # retried after its search group raised: it decodes in a group of its own
    reported: bool = False  # tokens of it went to its request's on_tokens (in this decode or an earlier one)

    @property
    def constraints(self) -> Constraints | None:
        return self.request.constraints[self.index] if self.request.constraints else None

    @property
    def rows(self) -> int:  # a constrained sentence decodes with ConstrainedBeam's beam, at least 4
        options = self.request.options
        return options.beam_size if self.constraints is None else ConstrainedBeam.rows_of(options)

    @property
    def cost(self) -> int:  # source tokens x beam: what a batch's cross K/V holds
        return len(self.ids) * self.rows

    @property
    def cancelled(self) -> bool:  # its caller went away, or a sentence of its request failed: nobody waits for it
        return self.request.future.done()

    def again(self, alone: bool) -> Sentence:
        """The sentence to decode from its start once more, after a fault in what it decoded with."""
        return replace(self, alone=alone or self.alone)

    @property
    def repeats(self) -> bool:
        """Whether decoding it again gives what it gave so far: unless it samples unseeded and has streamed."""
        o = self.request.options
        return not (self.reported and o.sampling and o.seed is None)


@dataclass(eq=False)
class Lane:
    """A running batch on a step session of its own, and what may join it: at most max_rows rows and
    max_tokens source tokens x beam, of sentences of at most max_source tokens (None: any). `step_s`: its last
    step's time; `ahead_s`: (express lane) the time its steps took since the main lane's last step."""

    session: StepSession
    max_rows: int
    max_tokens: int
    max_source: int | None = None
    batch: RunningBatch = field(init=False)
    step_s: float = 0.0
    ahead_s: float = 0.0
    # After its session raised: groups of its sentences to decode again, each alone in the lane (`isolating`:
    # nothing else joins while one does), halved again while they fail (BatchingEngine.session_fault)
    cohorts: deque[list[Sentence]] = field(default_factory=deque)
    isolating: bool = False

    @property
    def express(self) -> bool:
        """The express lane is the one that takes short sentences only."""
        return self.max_source is not None

    def load(self) -> tuple[int, int]:
        """Rows and source tokens x beam of the sentences it holds."""
        running = self.batch.owners()
        return sum(x.rows for x in running), sum(x.cost for x in running)

    def takes(self, x: Sentence, rows: int, tokens: int) -> bool:
        """Whether x may join, the lane holding `rows` and `tokens`: an empty main lane takes any sentence."""
        if self.isolating or (self.express and len(x.ids) > self.max_source):
            return False
        fits = rows + x.rows <= self.max_rows and tokens + x.cost <= self.max_tokens
        return fits or (not rows and not self.express)


class BatchingEngine:
    """Sentences of token ids, already checked, from many threads: they wait in one bounded queue, and a
    worker thread decodes them in running batches, one per lane (see the module's docstring). Knows no text.
    start() (or `with`) starts the worker; close() refuses new requests, lets the queued and running ones
    finish and stops it."""

    def __init__(self, session: StepSession, specials: Specials, limits: BatchLimits = BatchLimits(),
                 metrics: Metrics | None = None, express_session: StepSession | None = None):
        if limits.express and express_session is None:
            raise ValueError("an express lane (express_tokens > 0) decodes on a step session of its own: pass "
                             "express_session (another backend.session())")
        self.session, self.specials, self.limits, self.metrics = session, specials, limits, metrics or Metrics()
        self.express_session = express_session if limits.express else None
        self.waiting: deque[Sentence] = deque()
        self.cond = threading.Condition()
        self.closed = False
        self.worker: threading.Thread | None = None  # start()
        self.lanes: list[Lane] = []  # the worker's
        self.answered = 0  # the worker's: requests answered since it was last free (next_sentences)

    # -- callers ---------------------------------------------------------------------------------------
    def start(self) -> BatchingEngine:
        """Start the worker (once: again does nothing)."""
        with self.cond:
            if self.worker is None:
                self.worker = threading.Thread(target=self.work, name="twostep-batcher", daemon=True)
                self.worker.start()
        return self

    @property
    def queue_depth(self) -> int:
        """Sentences waiting for a batch (not those decoding)."""
        return len(self.waiting)

    def submit(self, sources: Sequence[Sequence[int]], options: DecodeOptions,
               max_new_tokens: Sequence[int], prefix: Sequence[int] = (), on_tokens: OnTokens | None = None,
               on_sentence: OnSentence | None = None,
               constraints: Sequence[Constraints | None] | None = None) -> Future:
        """Queue one request of checked sentences; its future's result is their n-best hypotheses, in order.
        `max_new_tokens`: how far each sentence decodes (checked by the caller); `prefix`: tokens
        forced after the decoder's start (Entry.prefix: requests to different target languages share batches).
        Cancel the future to drop its rows. Raises BadInput for more sentences than may wait, and Overloaded when
        the queue cannot take them now.

        Streaming: `on_tokens(index, tokens so far)` after each step of a sentence decoding with greedy search or
        sampling (forced tokens and eos left out), `on_sentence(index, hypotheses)` once a sentence is done,
        before the future's result. Both run in the worker thread: keep them short (put on a queue). One that
        raises fails its request with that exception (its rows leave the batch), and no other.

        `constraints`: each sentence's (None: none), decoded by constrained beam search (Entry.constraints); not
        with sampling (BadInput)."""
        if constraints is not None and len(constraints) != len(sources):
            raise ValueError(f"{len(constraints)} constraints for {len(sources)} sentences")
        if constraints is not None and not any(c is not None for c in constraints):
            constraints = None
        if constraints is not None and options.sampling:
            raise BadInput("a glossary needs beam search or greedy decoding, not sampling")
        if len(sources) > self.limits.max_queue:
            raise BadInput(f"a request of {len(sources)} sentences cannot be queued: at most {self.limits.max_queue} "
                           "sentences wait at once; send fewer per request")
        request = Request([list(map(int, s)) for s in sources], options, tuple(map(int, prefix)), on_tokens,
                          on_sentence, list(constraints) if constraints is not None else None)
        if not sources:
            request.future.set_result([])
            return request.future
        limits = list(map(int, max_new_tokens))
        now = time.monotonic()
        with self.cond:
            if self.closed:
                raise Overloaded("the translator is shutting down and takes no new requests")
            if self.worker is None:
                raise RuntimeError("the batching engine is not started: call start() first, or use it in a with block")
            if len(self.waiting) + len(sources) > self.limits.max_queue:  # callers gone: not waiting any more
                self.waiting = deque(x for x in self.waiting if not x.cancelled)
            if len(self.waiting) + len(sources) > self.limits.max_queue:
                raise Overloaded(f"the queue is full ({len(self.waiting)} sentences waiting, at most "
                                 f"{self.limits.max_queue}); retry later")
            self.waiting.extend(Sentence(request, i, ids, limit, now)
                                for i, (ids, limit) in enumerate(zip(request.sources, limits)))
            self.cond.notify_all()
        return request.future

    def close(self, timeout: float | None = None) -> None:
        """Refuse new requests, finish the queued and running ones, stop the worker."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        if self.worker is not None:
            self.worker.join(timeout)

    def __enter__(self) -> BatchingEngine:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the worker ------------------------------------------------------------------------------------
    def work(self) -> None:
        try:
            self.decode_forever()
        except BaseException as exc:  # the worker cannot go on (the session is busy elsewhere): nobody is left waiting
            with self.cond:
                self.closed = True
                waiting, self.waiting = list(self.waiting), deque()
            for lane in self.lanes:  # those decoding, and those to decode again
                waiting += [*(lane.batch.owners() if hasattr(lane, "batch") else ()),
                            *(x for cohort in lane.cohorts for x in cohort)]
            self.fail(waiting, exc if isinstance(exc, Exception) else RuntimeError("the batching worker stopped"))
            if not isinstance(exc, TwostepError):
                raise
            log.error("the batching worker stopped: %s", exc)

    def decode_forever(self) -> None:
        lanes = [Lane(self.session, self.limits.max_batch_rows, self.limits.max_batch_tokens)]
        if self.express_session is not None:
            lanes.append(Lane(self.express_session, self.limits.express_rows,
                              self.limits.express_rows * self.limits.express_tokens, self.limits.express_tokens))
        self.lanes = lanes
        with contextlib.ExitStack() as stack:
            for lane in lanes:
                stack.enter_context(lane.session.claimed())
                self.restart(lane)
            while True:
                joining = self.next_sentences(lanes)
                if joining is None:
                    return
                for lane, sentences in zip(lanes, joining):
                    if sentences:
                        self.join(lane, sentences)
                lane = self.pick(lanes)
                if lane is not None:
                    self.step(lane)
                    if lane.express:
                        lane.ahead_s += lane.step_s
                    else:  # the main lane stepped: the express lane's lead starts again
                        lanes[-1].ahead_s = 0.0

    def step(self, lane: Lane) -> None:
        """One step of a lane's batch; its sentences done are answered, its streams told their tokens so far."""
        batch = lane.batch
        self.metrics.step(batch.live_rows, express=lane.express)
        started = time.perf_counter()
        try:
            finished = batch.step()
        except Exception as exc:
            self.session_fault(lane, [], exc)
            return
        finally:
            lane.step_s = time.perf_counter() - started
        self.answer_all(finished)
        if batch.broken is None and batch.streaming:
            try:
                self.report(batch.progress())
            except Exception as exc:  # freeing a faulty group's rows: the session's
                batch.broken = exc
        if batch.broken is not None:
            self.session_fault(lane, [], batch.broken)

    def restart(self, lane: Lane) -> None:
        lane.batch = RunningBatch(lane.session, specials=self.specials, cancelled=lambda sentence: sentence.cancelled,
                                  on_fault=self.group_fault)
        lane.isolating = False

    def group_fault(self, sentences: list[Sentence], exc: Exception) -> None:
        """A search group raised (RunningBatch's on_fault): its sentences' own fault, the batch goes on. A sentence
        that decoded alone fails its request; several are decoded again, each in a group of its own, before any
        of them fails (the one whose decode raises then fails alone)."""
        live = [x for x in sentences if not x.cancelled]
        retry = [x for x in live if not x.alone and len(live) > 1 and x.repeats]
        self.metrics.fault("search", len(live), len(retry))
        log.error("a search group of %d sentences (%s) raised: %s", len(live), self.described(live),
                  "each decodes again alone" if retry else "its requests fail", exc_info=exc)
        self.fail([x for x in live if x not in retry], Faulted(exc), logged=True)
        with self.cond:
            self.waiting.extendleft(reversed([x.again(alone=True) for x in retry]))  # first in the queue
            self.cond.notify_all()

    def session_fault(self, lane: Lane, joining: list[Sentence], exc: Exception) -> None:
        """The lane's session raised: which sentence made it raise cannot be told. The lane starts a new batch;
        its sentences (and those joining it) decode again, in cohorts of half of them that run alone in the
        lane, halved again while they fail; a sentence that fails alone fails its request."""
        # those joining may be among the batch's already (the session raised after their groups took them)
        live = [x for x in {id(x): x for x in [*lane.batch.owners(), *joining]}.values() if not x.cancelled]
        self.restart(lane)
        retry = [x for x in live if x.repeats] if len(live) > 1 else []
        self.metrics.fault("session", len(live), len(retry))
        log.error("the step session raised with %d sentences decoding (%s): %s", len(live), self.described(live),
                  "they decode again in smaller groups" if retry else "their requests fail", exc_info=exc)
        self.fail([x for x in live if x not in retry], Faulted(exc), logged=True)
        half = (len(retry) + 1) // 2
        for cohort in (retry[half:], retry[:half]):
            if cohort:
                lane.cohorts.appendleft([x.again(alone=False) for x in cohort])

    @staticmethod
    def described(sentences: list[Sentence]) -> str:
        requests = {id(x.request): x.request for x in sentences}
        return f"{len(requests)} request{'s' * (len(requests) != 1)}"

    def pick(self, lanes: list[Lane]) -> Lane | None:
        """The lane to step: the express lane while it runs, except that the main lane's steps get at least
        1 - express_share of the time (it runs a step once the express lane's steps since its last one took
        express_share / (1 - express_share) x its last step's time)."""
        running = [lane for lane in lanes if lane.batch.sentences]
        if len(running) < 2:
            return running[0] if running else None
        main, express = lanes
        share = self.limits.express_share
        return main if express.ahead_s * (1 - share) >= share * main.step_s else express

    def join(self, lane: Lane, joining: list[Sentence]) -> None:
        batch = lane.batch
        running = batch.sentences
        try:
            self.answer_all(batch.add([Entry(x.ids, x.request.key, x.limit, x, prefix=x.request.prefix,
                                             stream=x.request.on_tokens is not None, alone=x.alone,
                                             constraints=x.constraints)
                                       for x in joining]))
        except TwostepError as exc:  # refused before the batch changed (an engine profile's limit)
            if len(joining) == 1:
                self.fail(joining, exc)
            else:  # one at a time: only the sentence the session refuses fails
                for x in joining:
                    self.join(lane, [x])
            return
        except Exception as exc:
            self.session_fault(lane, joining, exc)
            return
        rows = sum(x.rows for x in joining)
        (self.metrics.joined if running else self.metrics.batch)(len(joining), rows)

    def fail(self, sentences: list[Sentence], exc: Exception, logged: bool = False) -> None:
        if not isinstance(exc, TwostepError) and not logged and sentences:
            log.error("decoding %d sentences failed", len(sentences), exc_info=exc)
        for x in sentences:
            try:
                x.request.future.set_exception(exc)
            except InvalidStateError:  # answered, or cancelled
                pass

    def next_sentences(self, lanes: list[Lane]) -> list[list[Sentence]] | None:
        """The sentences that join each lane now. While a lane runs: those waiting that fit (none when batching
        is static), without blocking. Otherwise it blocks until a batch is due: full, or max_wait_ms after its
        first sentence came or after the worker became free, whichever is later (callers answered by the last
        batch send their next requests in that time, and join this one instead of forming a batch of their
        own), or as soon as as many requests wait as the worker answered since it was last free (those callers
        are back: a lone client waits for nobody); None once closed and drained. A lane with cohorts to decode
        again (session_fault) takes the next one, alone, once it is empty."""
        starting = [self.next_cohort(lane) for lane in lanes]
        if any(starting) or any(lane.batch.sentences for lane in lanes):
            if not self.limits.inflight or not self.waiting:  # nothing to join: no lock, no scan (every step)
                return starting
            with self.cond:
                return [cohort + taken for cohort, taken in zip(starting, self.take(self.fitting(lanes)[0]))]
        free_since, callers = time.monotonic(), self.answered
        self.answered = 0
        with self.cond:
            while True:
                while self.waiting and self.waiting[0].cancelled:
                    self.waiting.popleft()
                if self.waiting:
                    break
                if self.closed:
                    return None
                self.cond.wait()
            deadline = max(self.waiting[0].arrived, free_since) + self.limits.max_wait_ms / 1000
            while True:
                taken, full = self.fitting(lanes)
                back = callers and len({id(x.request) for x in self.waiting}) >= callers
                if self.closed or full or back or time.monotonic() >= deadline:
                    return self.take(taken)
                self.cond.wait(deadline - time.monotonic())

    @staticmethod
    def next_cohort(lane: Lane) -> list[Sentence]:
        """The cohort a lane starts now: the next of its cohorts once its batch is empty (the lane then takes
        nothing else until it is done), or none."""
        if not (lane.cohorts or lane.isolating) or lane.batch.sentences:  # the first test is every step's
            return []
        lane.isolating = False
        while lane.cohorts:
            cohort = [x for x in lane.cohorts.popleft() if not x.cancelled]
            if cohort:
                lane.isolating = True
                return cohort
        return []

    def fitting(self, lanes: list[Lane]) -> tuple[list[list[Sentence]], bool]:
        """The waiting sentences that fit in each lane (after what it holds), in arrival order, from one scan
        of the queue (the first that fits nowhere ends it: later ones do not overtake it); and whether the
        batch is then full: a sentence waits that fits nowhere, or the main lane's rows are all taken."""
        load = [lane.load() for lane in lanes]
        taken: list[list[Sentence]] = [[] for _ in lanes]
        for x in self.waiting:
            if x.cancelled:
                continue
            i = next((i for i in range(len(lanes) - 1, -1, -1) if lanes[i].takes(x, *load[i])), None)
            if i is None:
                return taken, True
            load[i] = (load[i][0] + x.rows, load[i][1] + x.cost)
            taken[i].append(x)
        main = lanes[0]
        return taken, load[0][0] >= main.max_rows or load[0][1] >= main.max_tokens

    def take(self, taken: list[list[Sentence]]) -> list[list[Sentence]]:
        chosen = {id(x) for sentences in taken for x in sentences}
        if chosen:
            self.waiting = deque(x for x in self.waiting if id(x) not in chosen and not x.cancelled)
        return [sorted(sentences, key=lambda x: len(x.ids)) for sentences in taken]  # similar lengths side by side

    def answer_all(self, finished: list[tuple[Sentence, list[Hypothesis]]]) -> None:
        for sentence, hypotheses in finished:
            self.answer(sentence, hypotheses)

    def report(self, progress: list[tuple[Sentence, list[int]]]) -> None:
        """Streaming sentences' tokens so far, to their requests' on_tokens."""
        for sentence, tokens in progress:
            if not sentence.cancelled:
                sentence.reported = True
                self.call(sentence.request, sentence.request.on_tokens, sentence.index, tokens)

    def call(self, request: Request, callback: Callable, *args) -> bool:
        """A request's callback; one that raises fails its request (its rows leave at the next step)."""
        try:
            callback(*args)
            return True
        except Exception as exc:
            log.warning("a request's streaming callback raised %r: the request fails", exc)
            with contextlib.suppress(InvalidStateError):  # cancelled meanwhile
                request.future.set_exception(exc)
            return False

    def answer(self, sentence: Sentence, hypotheses: list[Hypothesis]) -> None:
        request = sentence.request
        if request.future.done():  # cancelled, or failed
            return
        if request.on_sentence is not None and not self.call(request, request.on_sentence, sentence.index,
                                                             hypotheses):
            return
        request.results[sentence.index] = hypotheses
        self.metrics.generated(len(hypotheses[0].tokens) if hypotheses else 0)
        request.remaining -= 1
        if request.remaining == 0:
            try:
                request.future.set_result(request.results)
                self.answered += 1
            except InvalidStateError:  # cancelled by its caller a moment ago
                pass
