"""Many callers, one model: a batching executor over any backend's step session.

Threads call `translate(...)` (or coroutines `await translate_async(...)`) on one shared `BatchingTranslator`.
Each request's sentences are checked in the caller's thread (a bad request fails alone, before it is queued),
then wait in one bounded queue. A worker thread takes sentences decoded with the same options, in arrival
order, until a batch holds `max_batch_tokens` source tokens x beam or `max_batch_rows` rows, or
`max_wait_ms` have passed since the first of them came or since the worker became free, whichever is later; sorts them by length and decodes them together. A sentence that finishes
leaves the running batch at the next step (its cache, cross K/V and mask rows are dropped) and its request
is answered as soon as its last sentence is done; a request whose caller went away (a cancelled future) has
its rows dropped the same way. A full queue refuses at once with `Overloaded`.

Each sentence decodes as if alone: its own max_new_tokens (2 x its length + 16, or the request's), and
sampling seeded per sentence, so outputs do not depend on what else shares the batch.

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
from twostep.runtime.decoding import DecodeOptions, Hypothesis, RowControl, StepSession
from twostep.runtime.tokenizer import Tokenizer
from twostep.runtime.translator import Specials, Translator

log = logging.getLogger("twostep.serving")


@dataclass(frozen=True)
class BatchLimits:
    """How the executor batches: a batch closes at max_batch_tokens (source tokens x beam) or max_batch_rows
    (sentences x beam), or once its first sentence has waited max_wait_ms; at most max_queue sentences wait."""

    max_batch_tokens: int = 4096
    max_batch_rows: int = 64
    max_wait_ms: float = 5.0
    max_queue: int = 1024

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
        """A batch started decoding."""

    def generated(self, tokens: int) -> None:
        """A sentence finished with this many tokens (its best hypothesis)."""


@dataclass(eq=False)
class Request:
    sources: list[list[int]]
    options: DecodeOptions
    future: Future = field(default_factory=Future)
    results: list = field(init=False)
    remaining: int = field(init=False)
    key: DecodeOptions = field(init=False)  # requests with equal keys share batches

    def __post_init__(self) -> None:
        self.results, self.remaining = [[] for _ in self.sources], len(self.sources)
        self.key = replace(self.options, max_new_tokens=None)  # max_new_tokens is a per-row limit


@dataclass(eq=False)
class Sentence:
    request: Request
    index: int  # in its request
    ids: list[int]
    limit: int  # its max_new_tokens
    arrived: float

    @property
    def cost(self) -> int:  # source tokens x beam: what a batch's cross K/V holds
        return len(self.ids) * self.request.options.beam_size

    @property
    def key(self) -> DecodeOptions:
        return self.request.key


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
        while True:
            batch = self.next_batch()
            if batch is None:
                return
            self.run(batch)

    def next_batch(self) -> list[Sentence] | None:
        """Blocks until a batch is due: full, or max_wait_ms after its first sentence came or after the worker
        became free, whichever is later (callers answered by the last batch send their next requests in that
        time, and join this one instead of forming a batch of their own); None once closed and drained."""
        free_since = time.monotonic()
        with self.cond:
            while True:
                while self.waiting and self.waiting[0].request.future.cancelled():
                    self.waiting.popleft()
                if self.waiting:
                    break
                if self.closed:
                    return None
                self.cond.wait()
            first = self.waiting[0]
            deadline = max(first.arrived, free_since) + self.limits.max_wait_ms / 1000
            while True:
                taken, full = self.fitting(first.key)
                if self.closed or full or time.monotonic() >= deadline:
                    return self.take(taken)
                self.cond.wait(deadline - time.monotonic())

    def fitting(self, options: DecodeOptions) -> tuple[list[Sentence], bool]:
        """The waiting sentences with these options that fit in one batch, in arrival order, from one scan of
        the queue; and whether the batch is full: another sentence with these options is waiting that does
        not fit, or the next could not (waiting for more would gain nothing)."""
        taken, tokens, rows = [], 0, 0
        for s in self.waiting:
            if s.key != options or s.request.future.cancelled():
                continue
            if rows and (tokens + s.cost > self.limits.max_batch_tokens
                         or rows + options.beam_size > self.limits.max_batch_rows):
                return taken, True
            tokens, rows = tokens + s.cost, rows + options.beam_size
            taken.append(s)
        full = tokens >= self.limits.max_batch_tokens or rows + options.beam_size > self.limits.max_batch_rows
        return taken, full

    def take(self, taken: list[Sentence]) -> list[Sentence]:
        chosen = set(map(id, taken))
        self.waiting = deque(s for s in self.waiting if id(s) not in chosen and not s.request.future.cancelled())
        return sorted(taken, key=lambda s: len(s.ids))  # similar lengths side by side, less padding

    def run(self, batch: list[Sentence]) -> None:
        options = batch[0].key
        s = self.specials
        control = RowControl(limits=[x.limit for x in batch], on_done=lambda i, hyps: self.answer(batch[i], hyps),
                             cancelled=lambda i: batch[i].request.future.cancelled())
        self.metrics.batch(len(batch), len(batch) * options.beam_size)
        try:
            decoding.decode(self.session, [x.ids for x in batch], options, bos_id=s.bos_id, eos_id=s.eos_id,
                            pad_id=s.pad_id, max_new_tokens=max(x.limit for x in batch), control=control)
        except Exception as exc:  # the batch's requests fail; the worker goes on with the next batch
            if not isinstance(exc, TwostepError):
                log.exception("decoding a batch of %d sentences failed", len(batch))
            for x in batch:
                try:
                    x.request.future.set_exception(exc)
                except InvalidStateError:  # answered, or cancelled
                    pass

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
