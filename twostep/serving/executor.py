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
import contextlib
import queue
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from twostep.errors import BadInput, TooLarge
from twostep.runtime.decoding import DecodeOptions, Hypothesis, StepSession
from twostep.runtime.decoding.constraints import Constraints
from twostep.runtime.decoding.search import ConstrainedBeam
from twostep.runtime.documents import DocumentPlan
from twostep.runtime.streaming import Event, Events, TextEvents
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
                 options: DecodeOptions | None = None, limits: BatchLimits = BatchLimits(),
                 metrics: Metrics | None = None, express_session: StepSession | None = None,
                 defaults: Mapping[str, Any] | None = None):
        self.engine = BatchingEngine(session, model_limits.specials, limits, metrics, express_session)
        # never decodes (the engine does): text, checks, limits, and the model's decoding defaults
        self.translator = Translator(session, model_limits, tokenizer, options=options, defaults=defaults)
        self.joiners: dict[int, bool] = {}  # which target tokens' text depends on the next (streams' TextDeltas)

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.translator.tokenizer

    @property
    def queue_depth(self) -> int:
        """Sentences waiting for a batch (not those decoding)."""
        return self.engine.queue_depth

    def encode(self, texts: Sequence[str], src_lang: str | None = None, tgt_lang: str | None = None) -> list[list[int]]:
        return self.translator.encode(texts, src_lang, tgt_lang)

    def options_with(self, **given: Any) -> DecodeOptions:
        """The model's decoding defaults with a request's options (None: not given): Translator.options_with."""
        return self.translator.options_with(**given)

    def submit_ids(self, sources: Sequence[Sequence[int]], options: DecodeOptions | None = None,
                   tgt_lang: str | None = None, on_tokens: OnTokens | None = None,
                   on_sentence: OnSentence | None = None,
                   constraints: Sequence[Constraints | None] | None = None) -> Future:
        """Queue one request; its future's result is decode_ids'. Cancel the future to drop its rows. Raises
        BadInput for a bad request or one beyond the admission limits (TooLarge for too much work: `admit`),
        and Overloaded when the queue cannot take it now. `on_tokens`, `on_sentence`: BatchingEngine.submit's
        streaming callbacks, in the worker thread. `constraints`: each sentence's (None: none; a glossary's terms,
        Translator.sentence_terms), decoded by constrained beam search at its beam (ConstrainedBeam.rows_of), its
        limit grown by their length (Translator.limits_with) within the server's; not with sampling."""
        options = self.translator.options if options is None else options
        if not isinstance(options, DecodeOptions):
            raise TypeError(f"options must be DecodeOptions, got {type(options).__name__}")
        constraints = [None] * len(sources) if constraints is None else list(constraints)
        if options.sampling and any(c is not None for c in constraints):
            raise BadInput("a glossary needs beam search or greedy decoding, not sampling")
        self.translator.check_ids(sources)
        limit = self.engine.limits.new_tokens(self.translator.limits.max_positions)
        new_tokens = [min(grown, limit) for ids, c in zip(sources, constraints)
                      for grown in self.translator.limits_with(self.new_tokens(ids, options), [c])]
        self.admit(options.beam_size, new_tokens,
                   [ConstrainedBeam.rows_of(options) if c is not None else options.beam_size for c in constraints])
        return self.engine.submit(sources, options, new_tokens, self.translator.prefix(tgt_lang), on_tokens,
                                  on_sentence, constraints)

    def admit(self, beam: int, new_tokens: Sequence[int], rows: Sequence[int] | None = None) -> None:
        """Refuse, before it is queued, a request beyond BatchLimits' admission limits: a beam above max_beam
        or wider than a batch (max_batch_rows), or more work, rows x its sentences' new tokens, than
        max_request_work (TooLarge). `rows`: each sentence's (default: `beam`; a constrained sentence's is at
        least ConstrainedBeam's). (A max_new_tokens above its limit was refused by new_tokens.)"""
        limits = self.engine.limits
        rows = [beam] * len(new_tokens) if rows is None else list(rows)
        if beam > limits.max_beam:
            raise BadInput(f"beam size {beam} is above the limit of {limits.max_beam} (max_beam; twostep serve "
                           "--max-beam): ask for a smaller beam")
        widest = max(rows, default=beam)
        if widest > limits.max_batch_rows:
            glossary = f" (a sentence with glossary terms decodes with a beam of at least {widest})" * (widest > beam)
            raise BadInput(f"beam size {widest} takes {widest} rows of one batch, which holds "
                           f"{limits.max_batch_rows} (max_batch_rows; twostep serve --max-batch-rows; the beam limit "
                           f"max_beam is {limits.max_beam}){glossary}: ask for a smaller beam")
        work = sum(r * t for r, t in zip(rows, new_tokens))
        if work > limits.max_request_work:
            counted = (f"{beam} x {sum(new_tokens)} = {work}" if all(r == beam for r in rows) else
                       f"{work} (a sentence with glossary terms counts a beam of at least {max(rows)})")
            raise TooLarge(f"the request's work (beam x new tokens, summed over its sentences) is {counted}, above "
                           f"the limit of {limits.max_request_work} (max_request_work; twostep serve "
                           "--max-request-work): send fewer sentences, a smaller beam or a lower max_new_tokens")

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
            return self.replace_unknowns(sources, future.result(timeout), options, tgt_lang)
        except FutureTimeout:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout} s; the request was cancelled") from None

    def replace_unknowns(self, sources: Sequence[Sequence[int]], hypotheses: list[list[Hypothesis]],
                         options: DecodeOptions | None, tgt_lang: str | None) -> list[list[Hypothesis]]:
        """Translator.replace_unknowns, in the caller's thread: the alignment runs apart from the running batch."""
        options = self.translator.options if options is None else options
        prefix = self.translator.prefix(tgt_lang)
        return self.translator.replace_unknowns(sources, hypotheses, options, [prefix] * len(sources))

    def split_documents(self, texts: Sequence[str], src_lang: str | None = None,
                        tgt_lang: str | None = None) -> tuple[list[str], DocumentPlan]:
        """Each text as a document: its sentences (what the admission limits count) and the plan that joins
        their translations back, as Translator.split_documents."""
        return self.translator.split_documents(texts, src_lang, tgt_lang)

    def sources(self, texts: Sequence[str], src_lang: str | None, tgt_lang: str | None,
                split: bool) -> tuple[list[list[int]], DocumentPlan | None]:
        """The source ids of `texts`; with `split`, of each text's sentences (all of them rows of one request),
        and the plan that joins their translations back (Translator.encode_documents)."""
        if split:
            return self.translator.encode_documents(texts, src_lang, tgt_lang)
        return self.encode(texts, src_lang, tgt_lang), None

    def translate(self, texts: Sequence[str], options: DecodeOptions | None = None, src_lang: str | None = None,
                  tgt_lang: str | None = None, split: bool = False) -> list[str]:
        """`split`: each text is a document, its sentences rows of one request (Translator.translate)."""
        ids, plan = self.sources(texts, src_lang, tgt_lang, split)
        out = self.translator.best_texts(self.decode_ids(ids, options, tgt_lang=tgt_lang))
        return plan.join(out) if plan else out

    def translate_nbest(self, texts: Sequence[str], options: DecodeOptions | None = None,
                        src_lang: str | None = None, tgt_lang: str | None = None,
                        split: bool = False) -> list[list[tuple[str, float]]]:
        ids, plan = self.sources(texts, src_lang, tgt_lang, split)
        out = self.translator.nbest_texts(self.decode_ids(ids, options, tgt_lang=tgt_lang))
        return plan.join_nbest(out) if plan else out

    async def decode_ids_async(self, sources: Sequence[Sequence[int]], options: DecodeOptions | None = None,
                               tgt_lang: str | None = None) -> list[list[Hypothesis]]:
        """Cancelling the awaiting task cancels the request: its rows leave the batch."""
        hypotheses = await asyncio.wrap_future(self.submit_ids(sources, options, tgt_lang))
        return await self.replace_unknowns_async(sources, hypotheses, options, tgt_lang)

    async def replace_unknowns_async(self, sources: Sequence[Sequence[int]], hypotheses: list[list[Hypothesis]],
                                     options: DecodeOptions | None, tgt_lang: str | None) -> list[list[Hypothesis]]:
        """replace_unknowns in a thread of its own (never the engine's, whose batch would wait), where a
        hypothesis holds <unk>."""
        unk = self.translator.limits.specials.unk_id
        if (options or self.translator.options).replace_unknowns and any(
                unk in h.tokens for hyps in hypotheses for h in hyps):
            return await asyncio.to_thread(self.replace_unknowns, sources, hypotheses, options, tgt_lang)
        return hypotheses

    async def translate_async(self, texts: Sequence[str], options: DecodeOptions | None = None,
                              src_lang: str | None = None, tgt_lang: str | None = None,
                              split: bool = False) -> list[str]:
        ids, plan = self.sources(texts, src_lang, tgt_lang, split)
        out = self.translator.best_texts(await self.decode_ids_async(ids, options, tgt_lang))
        return plan.join(out) if plan else out

    async def translate_nbest_async(self, texts: Sequence[str], options: DecodeOptions | None = None,
                                    src_lang: str | None = None, tgt_lang: str | None = None,
                                    split: bool = False) -> list[list[tuple[str, float]]]:
        ids, plan = self.sources(texts, src_lang, tgt_lang, split)
        out = self.translator.nbest_texts(await self.decode_ids_async(ids, options, tgt_lang))
        return plan.join_nbest(out) if plan else out

    def submit_stream(self, sources: Sequence[Sequence[int]], options: DecodeOptions | None,
                      tgt_lang: str | None, put: Callable[[tuple | None], None],
                      constraints: Sequence[Constraints | None] | None = None) -> tuple[Future, Events]:
        """Queue token ids whose decode reports to `put` (in the worker thread): ("tokens" | "done", index, tokens
        or hypotheses), then None once the request is answered, failed or cancelled. Raises as submit_ids
        (`constraints`: its)."""
        options = self.translator.options if options is None else options
        events = Events(self.tokenizer, deltas=options.beam_size == 1, joiners=self.joiners)
        future = self.submit_ids(sources, options, tgt_lang,
                                 on_tokens=(lambda i, tokens: put(("tokens", i, tokens))) if events.deltas else None,
                                 on_sentence=lambda i, hyps: put(("done", i, hyps)), constraints=constraints)
        future.add_done_callback(lambda _: put(None))
        return future, events

    @staticmethod
    def events(events: Events, items: list[tuple | None]) -> list[Event]:
        """The events of the reports that came since the last look (a None ends them), the tokens of a sentence
        that reported several steps read once, at its latest (and not at all if it finished meanwhile: its
        SentenceDone gives the rest of its text): a consumer that falls behind catches up in fewer, larger
        deltas instead of one event per step."""
        out: list[Event] = []
        latest: dict[int, Sequence[int]] = {}
        for item in items:
            if item is None:
                break
            kind, sentence, value = item
            if kind == "tokens":
                latest[sentence] = value
            else:
                latest.pop(sentence, None)
                out += events.done(sentence, value)
        for sentence, tokens in latest.items():
            out += events.tokens(sentence, tokens)
        return out

    def stream(self, texts: Sequence[str], options: DecodeOptions | None = None, src_lang: str | None = None,
               tgt_lang: str | None = None, split: bool = False) -> Iterator[Event]:
        """translate() as it decodes, as Translator.stream: Delta and SentenceDone events (runtime.streaming);
        with `split`, of each text's sentences, and a TextDone once a text's sentences are all done. Its
        sentences share the running batch with every other request. Closing the iterator before its end (or
        leaving a for loop over it) cancels the request: its rows leave the batch. Raises what the request
        fails with."""
        ids, plan = self.sources(texts, src_lang, tgt_lang, split)
        texts_done = TextEvents(plan) if plan else None
        items: queue.SimpleQueue = queue.SimpleQueue()
        future, events = self.submit_stream(ids, options, tgt_lang, items.put)
        try:
            while True:
                came = [items.get()]
                while came[-1] is not None and not items.empty():
                    came.append(items.get())
                for event in self.events(events, came):
                    yield event
                    yield from texts_done.after(event) if texts_done else ()
                if came[-1] is None:
                    break
            future.result()
        finally:
            future.cancel()

    def stream_ids_async(self, sources: Sequence[Sequence[int]], options: DecodeOptions | None = None,
                         tgt_lang: str | None = None, texts_done: TextEvents | None = None,
                         constraints: Sequence[Constraints | None] | None = None) -> AsyncIterator[Event]:
        """Queue token ids now (raising as submit_ids: a refusal comes before any event) and give their events
        as they decode, to coroutines (the worker hands each report to the event loop: call_soon_threadsafe);
        `texts_done`: TextDone events too. The request is cancelled, its rows leaving the batch, once the
        consumer is cancelled or closes the generator (aclose(); contextlib.aclosing around an `async for` that
        may stop early)."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue = asyncio.Queue()
        future, events = self.submit_stream(sources, options, tgt_lang,
                                            lambda item: loop.call_soon_threadsafe(items.put_nowait, item),
                                            constraints)

        async def stream() -> AsyncIterator[Event]:
            try:
                while True:
                    came = [await items.get()]
                    while came[-1] is not None and not items.empty():
                        came.append(items.get_nowait())
                    for event in self.events(events, came):
                        yield event
                        for done in texts_done.after(event) if texts_done else ():
                            yield done
                    if came[-1] is None:
                        break
                future.result()
            finally:
                future.cancel()

        return stream()

    async def stream_async(self, texts: Sequence[str], options: DecodeOptions | None = None,
                           src_lang: str | None = None, tgt_lang: str | None = None,
                           split: bool = False) -> AsyncIterator[Event]:
        """stream() for coroutines (stream_ids_async)."""
        ids, plan = self.sources(texts, src_lang, tgt_lang, split)
        texts_done = TextEvents(plan) if plan else None
        async with contextlib.aclosing(self.stream_ids_async(ids, options, tgt_lang, texts_done)) as events:
            async for event in events:
                yield event

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


def open_batching_translator(model_dir, backend: str | None = None, options: DecodeOptions | None = None,
                             limits: BatchLimits = BatchLimits(), metrics: Metrics | None = None,
                             **backend_options) -> tuple[BatchingTranslator, object]:
    """A started BatchingTranslator over an artifact (or checkpoint) directory, like
    runtime.translator.open_translator; engine backends are sized for max_batch_rows rows. Returns
    (translator, backend): close both."""
    from twostep.runtime.translator import open_translator

    plain, be = open_translator(model_dir, backend, batch_size=limits.max_batch_rows, **backend_options)
    express = be.session() if limits.express else None
    translator = BatchingTranslator(plain.session, plain.limits, plain.tokenizer, options or plain.options, limits,
                                    metrics, express, plain.defaults)
    return translator.start(), be
