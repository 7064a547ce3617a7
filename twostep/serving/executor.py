"""Many callers, one model: `BatchingTranslator`, the front that threads and coroutines share.

Threads call `translate(...)` (or coroutines `await translate_async(...)`) on one shared BatchingTranslator: a
plain `Translator` (text to token ids and back, each request's checks, in the caller's thread: a bad request
fails alone, before it is queued, as does one beyond BatchLimits' admission limits: `admit`) composed with a
`BatchingEngine` (twostep.serving.engine: the queue, the lanes and the worker that decodes in running batches,
in flight or static, as BatchLimits say). Each sentence decodes as if alone, so outputs do not depend on what
else shares a batch, or on when a sentence joined it. `stream` and `stream_async` give a request's text as it
decodes (twostep.runtime.streaming's events); a consumer that stops cancels its request.

Imports no web framework: `twostep.serving.http` and `twostep.serving.ray_app` serve it.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from twostep.errors import BadInput, TooLarge
from twostep.runtime.decoding import DecodeOptions, Hypothesis, StepSession
from twostep.runtime.streaming import Event, Events
from twostep.runtime.tokenizer import Tokenizer
from twostep.runtime.translator import Limits, Translator
from twostep.serving.engine import BatchingEngine, Metrics, OnSentence, OnTokens
from twostep.serving.limits import BatchLimits


class BatchingTranslator:
    """A translator that many threads and coroutines share: a plain Translator (`translator`: text to token ids
    and back, each request's checks) in front of a BatchingEngine (`engine`) that merges their sentences into
    batches. Start it with start() or use it as a context manager; close(): queued and running sentences finish,
    new requests are refused."""

    def __init__(self, session: StepSession, model_limits: Limits, tokenizer: Tokenizer | None = None,
                 options: DecodeOptions = DecodeOptions(), limits: BatchLimits = BatchLimits(),
                 metrics: Metrics | None = None, express_session: StepSession | None = None):
        self.engine = BatchingEngine(session, model_limits.specials, limits, metrics, express_session)
        # never decodes (the engine does): text, checks and limits
        self.translator = Translator(session, model_limits, tokenizer, options=options)

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.translator.tokenizer

    @property
    def queue_depth(self) -> int:
        """Sentences waiting for a batch (not those decoding)."""
        return self.engine.queue_depth

    def encode(self, texts: Sequence[str], src_lang: str | None = None, tgt_lang: str | None = None) -> list[list[int]]:
        return self.translator.encode(texts, src_lang, tgt_lang)

    def submit_ids(self, sources: Sequence[Sequence[int]], options: DecodeOptions | None = None,
                   tgt_lang: str | None = None, on_tokens: OnTokens | None = None,
                   on_sentence: OnSentence | None = None) -> Future:
        """Queue one request; its future's result is decode_ids'. Cancel the future to drop its rows. Raises
        BadInput for a bad request or one beyond the admission limits (TooLarge for too much work: `admit`),
        and Overloaded when the queue cannot take it now. `on_tokens`, `on_sentence`: BatchingEngine.submit's
        streaming callbacks, in the worker thread."""
        options = self.translator.options if options is None else options
        if not isinstance(options, DecodeOptions):
            raise TypeError(f"options must be DecodeOptions, got {type(options).__name__}")
        self.translator.check_ids(sources)
        new_tokens = [self.new_tokens(ids, options) for ids in sources]
        self.admit(options.beam_size, new_tokens)
        return self.engine.submit(sources, options, new_tokens, self.translator.prefix(tgt_lang), on_tokens,
                                  on_sentence)

    def admit(self, beam: int, new_tokens: Sequence[int]) -> None:
        """Refuse, before it is queued, a request beyond BatchLimits' admission limits: a beam above max_beam
        or wider than a batch (max_batch_rows), or more work, beam x its sentences' new tokens, than
        max_request_work (TooLarge). (A max_new_tokens above its limit was refused by new_tokens.)"""
        limits = self.engine.limits
        if beam > limits.max_beam:
            raise BadInput(f"beam size {beam} is above the limit of {limits.max_beam} (max_beam; twostep serve "
                           "--max-beam): ask for a smaller beam")
        if beam > limits.max_batch_rows:
            raise BadInput(f"beam size {beam} takes {beam} rows of one batch, which holds {limits.max_batch_rows} "
                           f"(max_batch_rows; twostep serve --max-batch-rows; the beam limit max_beam is "
                           f"{limits.max_beam}): ask for a smaller beam")
        tokens = sum(new_tokens)
        if beam * tokens > limits.max_request_work:
            raise TooLarge(f"the request's work (beam x new tokens, summed over its sentences) is {beam} x {tokens} "
                           f"= {beam * tokens}, above the limit of {limits.max_request_work} (max_request_work; "
                           "twostep serve --max-request-work): send fewer sentences, a smaller beam or a lower "
                           "max_new_tokens")

    def new_tokens(self, ids: Sequence[int], options: DecodeOptions) -> int:
        """How far a sentence decodes: the Translator's max_new_tokens (the request's, else 2 x source + 16),
        the default capped at the limit (BatchLimits.new_tokens); a request's own above the limit is a
        BadInput, not a silently shorter translation."""
        limit = self.engine.limits.new_tokens(self.translator.limits.max_positions)
        if options.max_new_tokens is not None and options.max_new_tokens > limit:
            raise BadInput(f"max_new_tokens {options.max_new_tokens} is above the limit of {limit} new tokens a "
                           "sentence (max_new_tokens; twostep serve --max-new-tokens, at most the model's "
                           "max_positions): ask for fewer")
        return min(self.translator.max_new_tokens([ids], options), limit)

    def decode_ids(self, sources: Sequence[Sequence[int]], options: DecodeOptions | None = None,
                   timeout: float | None = None, tgt_lang: str | None = None) -> list[list[Hypothesis]]:
        """Token ids in (each ending with eos), n-best hypotheses out, in input order, as Translator.decode_ids;
        after `timeout` seconds the request is cancelled and TimeoutError raised."""
        future = self.submit_ids(sources, options, tgt_lang)
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout} s; the request was cancelled") from None

    def translate(self, texts: Sequence[str], options: DecodeOptions | None = None, src_lang: str | None = None,
                  tgt_lang: str | None = None) -> list[str]:
        ids = self.encode(texts, src_lang, tgt_lang)
        return self.translator.best_texts(self.decode_ids(ids, options, tgt_lang=tgt_lang))

    def translate_nbest(self, texts: Sequence[str], options: DecodeOptions | None = None,
                        src_lang: str | None = None, tgt_lang: str | None = None) -> list[list[tuple[str, float]]]:
        ids = self.encode(texts, src_lang, tgt_lang)
        return self.translator.nbest_texts(self.decode_ids(ids, options, tgt_lang=tgt_lang))

    async def decode_ids_async(self, sources: Sequence[Sequence[int]], options: DecodeOptions | None = None,
                               tgt_lang: str | None = None) -> list[list[Hypothesis]]:
        """Cancelling the awaiting task cancels the request: its rows leave the batch."""
        return await asyncio.wrap_future(self.submit_ids(sources, options, tgt_lang))

    async def translate_async(self, texts: Sequence[str], options: DecodeOptions | None = None,
                              src_lang: str | None = None, tgt_lang: str | None = None) -> list[str]:
        ids = self.encode(texts, src_lang, tgt_lang)
        return self.translator.best_texts(await self.decode_ids_async(ids, options, tgt_lang))

    async def translate_nbest_async(self, texts: Sequence[str], options: DecodeOptions | None = None,
                                    src_lang: str | None = None,
                                    tgt_lang: str | None = None) -> list[list[tuple[str, float]]]:
        ids = self.encode(texts, src_lang, tgt_lang)
        return self.translator.nbest_texts(await self.decode_ids_async(ids, options, tgt_lang))

    def submit_stream(self, texts: Sequence[str], options: DecodeOptions | None, src_lang: str | None,
                      tgt_lang: str | None, put: Callable[[tuple | None], None]) -> tuple[Future, Events]:
        """Queue texts whose decode reports to `put` (in the worker thread): ("tokens" | "done", index, tokens or
        hypotheses), then None once the request is answered, failed or cancelled."""
        options = self.translator.options if options is None else options
        ids = self.encode(texts, src_lang, tgt_lang)
        events = Events(self.tokenizer, deltas=options.beam_size == 1)
        future = self.submit_ids(ids, options, tgt_lang,
                                 on_tokens=(lambda i, tokens: put(("tokens", i, tokens))) if events.deltas else None,
                                 on_sentence=lambda i, hyps: put(("done", i, hyps)))
        future.add_done_callback(lambda _: put(None))
        return future, events

    @staticmethod
    def events(events: Events, item: tuple) -> list[Event]:
        kind, sentence, value = item
        return events.tokens(sentence, value) if kind == "tokens" else events.done(sentence, value)

    def stream(self, texts: Sequence[str], options: DecodeOptions | None = None, src_lang: str | None = None,
               tgt_lang: str | None = None) -> Iterator[Event]:
        """translate() as it decodes, as Translator.stream: Delta and SentenceDone events (runtime.streaming).
        Its sentences share the running batch with every other request. Closing the iterator before its end
        (or leaving a for loop over it) cancels the request: its rows leave the batch. Raises what the request
        fails with."""
        items: queue.SimpleQueue = queue.SimpleQueue()
        future, events = self.submit_stream(texts, options, src_lang, tgt_lang, items.put)
        try:
            while (item := items.get()) is not None:
                yield from self.events(events, item)
            future.result()
        finally:
            future.cancel()

    async def stream_async(self, texts: Sequence[str], options: DecodeOptions | None = None,
                           src_lang: str | None = None, tgt_lang: str | None = None) -> AsyncIterator[Event]:
        """stream() for coroutines: the worker hands each report to the event loop (call_soon_threadsafe). The
        request is cancelled, its rows leaving the batch, once the consumer is cancelled or closes the
        generator (aclose(); contextlib.aclosing around an `async for` that may stop early)."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue = asyncio.Queue()
        future, events = self.submit_stream(texts, options, src_lang, tgt_lang,
                                            lambda item: loop.call_soon_threadsafe(items.put_nowait, item))
        try:
            while (item := await items.get()) is not None:
                for event in self.events(events, item):
                    yield event
            future.result()
        finally:
            future.cancel()

    def start(self) -> BatchingTranslator:
        """Start the engine's worker (once: again does nothing)."""
        self.engine.start()
        return self

    def close(self, timeout: float | None = None) -> None:
        """Refuse new requests, finish the queued and running ones, stop the worker."""
        self.engine.close(timeout)

    def __enter__(self) -> BatchingTranslator:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def batching_advice(backend, limits: BatchLimits) -> str | None:
    """What a server tells its operator at start about how it batches on this backend, or None: in flight, what
    the backend says of the decoder it chose (Backend.inflight_advice); static batching has no oldest row to
    wait on."""
    return backend.inflight_advice() if limits.inflight else None


def open_batching_translator(model_dir, backend: str | None = None, options: DecodeOptions = DecodeOptions(),
                             limits: BatchLimits = BatchLimits(), metrics: Metrics | None = None,
                             **backend_options) -> tuple[BatchingTranslator, object]:
    """A started BatchingTranslator over an artifact (or checkpoint) directory, like
    runtime.translator.open_translator; engine backends are sized for max_batch_rows rows. Returns
    (translator, backend): close both."""
    from twostep.runtime.translator import open_translator

    plain, be = open_translator(model_dir, backend, batch_size=limits.max_batch_rows, **backend_options)
    express = be.session() if limits.express else None
    translator = BatchingTranslator(plain.session, plain.limits, plain.tokenizer, options, limits, metrics, express)
    return translator.start(), be
