"""Many callers, one model: a batching executor over any backend's step session.

Threads call `translate(...)` (or coroutines `await translate_async(...)`) on one shared `BatchingTranslator`.
Each request's sentences are checked in the caller's thread (a bad request fails alone, before it is queued),
then wait in one bounded queue. A worker thread decodes them in one running batch (decoding.RunningBatch):

- In-flight batching (the default): at every step boundary, the sentences waiting in the queue join the
  running batch, in arrival order, as long as it holds at most `max_batch_tokens` source tokens x beam and
  `max_batch_rows` rows. Their encoder runs for them alone; they take the rows that finished sentences freed
  (or new rows) with an empty history and decode next to sentences that are further on. A sentence that
  arrives while a batch decodes waits at most one decoder step, not for the batch to end.
- Static batching (`inflight=False`): a batch takes what fits and runs until its last sentence is done;
  sentences that arrive meanwhile wait for the next batch.

Either way a batch starts once its first sentence has waited `max_wait_ms` after it came or after the worker
became free (whichever is later), or sooner once the batch is full; sentences decoded with different options
share it (each decodes with its own). A sentence that finishes leaves the batch at that step (its rows are
freed for the next to join) and its request is answered as soon as its last sentence is done; a request
whose caller went away (a cancelled future) has its rows freed the same way. A full queue refuses at once
with `Overloaded`.

Each sentence decodes as if alone: its own max_new_tokens (2 x its length + 16, or the request's), sampling
seeded per sentence, and rows computed without regard to their neighbours, so outputs do not depend on what
else shares the batch, or on when a sentence joined it.

Imports no web framework: `twostep.serving.http` and `twostep.serving.ray_app` serve it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace

from twostep.errors import BadInput, Overloaded, TwostepError
from twostep.runtime import decoding
from twostep.runtime.decoding import DecodeOptions, Entry, Hypothesis, RunningBatch, StepSession
from twostep.runtime.tokenizer import Tokenizer
from twostep.runtime.translator import Specials, Translator

log = logging.getLogger("twostep.serving")


BATCHING = {"inflight": True, "static": False}  # `--batching` (serve) and `batching=` (Ray): BatchLimits.inflight


@dataclass(frozen=True)
class BatchLimits:
    """How the executor batches: a batch holds at most max_batch_tokens (source tokens x beam) and
    max_batch_rows (sentences x beam); it starts once its first sentence has waited max_wait_ms (or is
    full); at most max_queue sentences wait. `inflight`: waiting sentences join the running batch at the next
    step (False: they wait for it to end; docs/benchmarks.md measures both)."""

    max_batch_tokens: int = 4096
    max_batch_rows: int = 64
    max_wait_ms: float = 5.0
    max_queue: int = 1024
    inflight: bool = True

    def __post_init__(self) -> None:
        problems = [f"{name} must be positive, got {getattr(self, name)!r}"
                    for name in ("max_batch_tokens", "max_batch_rows", "max_queue") if getattr(self, name) < 1]
        if self.max_wait_ms < 0:
            problems.append(f"max_wait_ms must be 0 or more, got {self.max_wait_ms!r}")
        if problems:
            raise BadInput("bad batching limits: " + "; ".join(problems))


class Metrics:
    """What the executor reports; the HTTP server's Prometheus metrics subclass it. This one counts nothing."""

    def batch(self, sentences: int, rows: int) -> None:
        """A batch started decoding with these sentences and rows."""

    def joined(self, sentences: int, rows: int) -> None:
        """Sentences joined a running batch."""

    def step(self, rows: int) -> None:
        """A decoder step ran for this many rows of sentences (free rows not counted)."""

    def generated(self, tokens: int) -> None:
        """A sentence finished with this many tokens (its best hypothesis)."""


@dataclass(eq=False)
class Request:
    sources: list[list[int]]
    options: DecodeOptions
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

    @property
    def rows(self) -> int:
        return self.request.options.beam_size

    @property
    def cost(self) -> int:  # source tokens x beam: what a batch's cross K/V holds
        return len(self.ids) * self.rows

    @property
    def cancelled(self) -> bool:  # its caller went away, or a sentence of its request failed: nobody waits for it
        return self.request.future.done()


class BatchingTranslator(Translator):
    """A Translator that many threads and coroutines share: their sentences are merged into batches (see the
    module's docstring). Use it as a context manager, or call close(): queued and running sentences finish,
    new requests are refused."""

    def __init__(self, session: StepSession, specials: Specials, tokenizer: Tokenizer | None = None,
                 options: DecodeOptions = DecodeOptions(), limits: BatchLimits = BatchLimits(),
                 metrics: Metrics | None = None):
        super().__init__(session, specials, tokenizer, batch_size=limits.max_batch_rows, options=options)
        self.limits, self.metrics = limits, metrics or Metrics()
        self.waiting: deque[Sentence] = deque()
        self.cond = threading.Condition()
        self.closed = False
        self.worker = threading.Thread(target=self.work, name="twostep-batcher", daemon=True)
        self.worker.start()

    # -- callers ---------------------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        """Sentences waiting for a batch (not those decoding)."""
        return len(self.waiting)

    def submit_ids(self, sources: Sequence[Sequence[int]], options: DecodeOptions | None = None) -> Future:
        """Queue one request; its future's result is decode_ids'. Cancel the future to drop its rows. Raises
        BadInput for a bad request and Overloaded when the queue cannot take it now."""
        options = self.options if options is None else options
        if not isinstance(options, DecodeOptions):
            raise TypeError(f"options must be DecodeOptions, got {type(options).__name__}")
        self.check_ids(sources)
        if len(sources) > self.limits.max_queue:
            raise BadInput(f"a request of {len(sources)} sentences cannot be queued: at most {self.limits.max_queue} "
                           "sentences wait at once; send fewer per request")
        request = Request([list(map(int, s)) for s in sources], options)
        if not sources:
            request.future.set_result([])
            return request.future
        limits = [self.max_new_tokens([ids], options) for ids in request.sources]  # BadInput before queueing
        now = time.monotonic()
        with self.cond:
            if self.closed:
                raise Overloaded("the translator is shutting down and takes no new requests")
            if len(self.waiting) + len(sources) > self.limits.max_queue:  # callers gone: not waiting any more
                self.waiting = deque(x for x in self.waiting if not x.cancelled)
            if len(self.waiting) + len(sources) > self.limits.max_queue:
                raise Overloaded(f"the queue is full ({len(self.waiting)} sentences waiting, at most "
                                 f"{self.limits.max_queue}); retry later")
            self.waiting.extend(Sentence(request, i, ids, limit, now)
                                for i, (ids, limit) in enumerate(zip(request.sources, limits)))
            self.cond.notify_all()
        return request.future

    def decode_ids(self, sources: Sequence[Sequence[int]], options: DecodeOptions | None = None,
                   timeout: float | None = None) -> list[list[Hypothesis]]:
        future = self.submit_ids(sources, options)
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout} s; the request was cancelled") from None

    async def decode_ids_async(self, sources: Sequence[Sequence[int]],
                               options: DecodeOptions | None = None) -> list[list[Hypothesis]]:
        """Cancelling the awaiting task cancels the request: its rows leave the batch."""
        return await asyncio.wrap_future(self.submit_ids(sources, options))

    async def translate_async(self, texts: Sequence[str], options: DecodeOptions | None = None) -> list[str]:
        hyps = await self.decode_ids_async(self.encode(texts), options)
        return [self.tokenizer.decode(h[0].tokens if h else []) for h in hyps]

    async def translate_nbest_async(self, texts: Sequence[str],
                                    options: DecodeOptions | None = None) -> list[list[tuple[str, float]]]:
        hyps = await self.decode_ids_async(self.encode(texts), options)
        return [[(self.tokenizer.decode(h.tokens), h.score) for h in hs] for hs in hyps]

    def close(self, timeout: float | None = None) -> None:
        """Refuse new requests, finish the queued and running ones, stop the worker."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.worker.join(timeout)

    def __enter__(self) -> "BatchingTranslator":
        return self

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
            self.fail(waiting, exc if isinstance(exc, Exception) else RuntimeError("the batching worker stopped"))
            if not isinstance(exc, TwostepError):
                raise
            log.error("the batching worker stopped: %s", exc)

    def decode_forever(self) -> None:
        s = self.specials
        with decoding.exclusive(self.session):
            batch = RunningBatch(self.session, bos_id=s.bos_id, eos_id=s.eos_id, pad_id=s.pad_id,
                                 cancelled=lambda sentence: sentence.cancelled)
            while True:
                joining = self.next_sentences(batch)
                if joining is None:
                    return
                try:
                    if joining:
                        self.join(batch, joining)
                    if batch.sentences:
                        self.metrics.step(batch.live_rows)
                        self.answer_all(batch.step())
                except Exception as exc:  # the batch's requests fail; the worker goes on with a new batch
                    self.fail([*batch.owners(), *joining], exc)
                    batch = RunningBatch(self.session, bos_id=s.bos_id, eos_id=s.eos_id, pad_id=s.pad_id,
                                         cancelled=lambda sentence: sentence.cancelled)

    def join(self, batch: RunningBatch, joining: list[Sentence]) -> None:
        running = batch.sentences
        try:
            self.answer_all(batch.add([Entry(x.ids, x.request.key, x.limit, x) for x in joining]))
        except TwostepError as exc:  # refused before the batch changed (an engine profile's limit)
            if len(joining) == 1:
                self.fail(joining, exc)
            else:  # one at a time: only the sentence the session refuses fails
                for x in joining:
                    self.join(batch, [x])
            return
        rows = sum(x.rows for x in joining)
        (self.metrics.joined if running else self.metrics.batch)(len(joining), rows)

    def fail(self, sentences: list[Sentence], exc: Exception) -> None:
        if not isinstance(exc, TwostepError):
            log.exception("decoding a batch of %d sentences failed", len(sentences))
        for x in sentences:
            try:
                x.request.future.set_exception(exc)
            except InvalidStateError:  # answered, or cancelled
                pass

    def next_sentences(self, batch: RunningBatch) -> list[Sentence] | None:
        """The sentences that join the batch now. While it runs: those waiting that fit (none when batching is
        static), without blocking. Otherwise it blocks until a batch is due: full, or max_wait_ms after its
        first sentence came or after the worker became free, whichever is later (callers answered by the last
        batch send their next requests in that time, and join this one instead of forming a batch of their
        own); None once closed and drained."""
        if batch.sentences:
            if not self.limits.inflight:
                return []
            with self.cond:
                running = batch.owners()
                return self.take(self.fitting(sum(x.rows for x in running), sum(x.cost for x in running))[0])
        free_since = time.monotonic()
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
                taken, full = self.fitting()
                if self.closed or full or time.monotonic() >= deadline:
                    return self.take(taken)
                self.cond.wait(deadline - time.monotonic())

    def fitting(self, rows: int = 0, tokens: int = 0) -> tuple[list[Sentence], bool]:
        """The waiting sentences that fit in a batch already holding `rows` and `tokens`, in arrival order,
        from one scan of the queue (the first that does not fit ends it: later ones do not overtake it); and
        whether the batch is then full: a sentence waits that does not fit, or the rows are all taken."""
        taken, max_tokens, max_rows = [], self.limits.max_batch_tokens, self.limits.max_batch_rows
        for x in self.waiting:
            if x.cancelled:
                continue
            if (rows or taken) and (tokens + x.cost > max_tokens or rows + x.rows > max_rows):
                return taken, True
            tokens, rows = tokens + x.cost, rows + x.rows
            taken.append(x)
        return taken, tokens >= max_tokens or rows >= max_rows

    def take(self, taken: list[Sentence]) -> list[Sentence]:
        if not taken:
            return taken
        chosen = set(map(id, taken))
        self.waiting = deque(x for x in self.waiting if id(x) not in chosen and not x.cancelled)
        return sorted(taken, key=lambda x: len(x.ids))  # similar lengths side by side, less padding

    def answer_all(self, finished: list[tuple[Sentence, list[Hypothesis]]]) -> None:
        for sentence, hypotheses in finished:
            self.answer(sentence, hypotheses)

    def answer(self, sentence: Sentence, hypotheses: list[Hypothesis]) -> None:
        request = sentence.request
        if request.future.done():  # cancelled, or failed
            return
        request.results[sentence.index] = hypotheses
        self.metrics.generated(len(hypotheses[0].tokens) if hypotheses else 0)
        request.remaining -= 1
        if request.remaining == 0:
            try:
                request.future.set_result(request.results)
            except InvalidStateError:  # cancelled by its caller a moment ago
                pass


def open_batching_translator(model_dir, backend: str | None = None, options: DecodeOptions = DecodeOptions(),
                             limits: BatchLimits = BatchLimits(), metrics: Metrics | None = None,
                             **backend_options) -> tuple[BatchingTranslator, object]:
    """A BatchingTranslator over an artifact (or checkpoint) directory, like runtime.translator.open_translator;
    engine backends are sized for max_batch_rows rows. Returns (translator, backend): close both."""
    from twostep.runtime.translator import open_translator

    plain, be = open_translator(model_dir, backend, batch_size=limits.max_batch_rows, **backend_options)
    return BatchingTranslator(plain.session, plain.specials, plain.tokenizer, options, limits, metrics), be


__all__ = ["BatchLimits", "BatchingTranslator", "Metrics", "Overloaded", "open_batching_translator"]
