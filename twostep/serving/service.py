"""What every HTTP API of `twostep serve` shares: the models (twostep.serving.models: which answers a pair, which
are loaded, each its own BatchingTranslator), the language detector, the metrics, the admission limits.

Each API is a router module (twostep.serving.api) over one `Service`: it parses its own requests, asks the
service for the route of their language pair (`route`, `detect` for a source to detect) and to translate
their texts along it (`translate`: every leg's sentences checked and queued in the shared in-flight batches of
its model), and words the service's refusals in its own way (`Refused`: a status per kind of error, in the
API's error shape). The service is opened and closed by the app's lifespan (`Service.lifespan`), so the same app
runs under uvicorn and as a Ray Serve ingress.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from twostep.errors import BadInput, Overloaded, TooLarge, TwostepError
from twostep.runtime.decoding import DecodeOptions, Hypothesis
from twostep.runtime.documents import DocumentPlan
from twostep.runtime.glossary import Entry, Found, Glossary, Terms
from twostep.serving.engine import Faulted, Metrics
from twostep.serving.executor import BatchingTranslator, batching_advice, open_batching_translator
from twostep.serving.glossaries import Glossaries, Stored
from twostep.serving.keys import KeyDatabase, KeyLimits, key_digest, known_key
from twostep.serving.limits import BatchLimits
from twostep.serving.models import Catalog, Loader, Model, Pool, Route

log = logging.getLogger("twostep.serving")
API_KEYS_ENV = "TWOSTEP_API_KEYS"  # keys separated by commas, beside or instead of a key file


@dataclass(frozen=True)
class ServeConfig:
    """What a server (or each Ray Serve replica) opens: picklable, so it travels to replicas."""

    model_dirs: tuple[str, ...]  # each an artifact (or checkpoint) folder, or a folder of artifacts
    backend: Optional[str] = None
    threads: Optional[int] = None
    limits: BatchLimits = field(default_factory=BatchLimits)
    max_sentences: int = 64  # per request, after documents are split into sentences
    max_chars: int = 20_000  # per request, all texts together (--char-limit, LibreTranslate's name)
    batch_limit: Optional[int] = None  # texts per request; None: no limit but max_sentences
    alternatives_limit: Optional[int] = None  # LibreTranslate's alternatives per request; None: the beam limit's
    req_limit: Optional[int] = None  # requests per minute per client (its key, else its address); None: no limit
    retry_after_s: int = 1
    api_key_digests: tuple[bytes, ...] = field(default=(), repr=False)  # read_api_keys'
    api_key_db: Optional[str] = None  # keys with limits of their own (twostep.serving.keys); neither: an open server
    protect_metrics: bool = False  # /metrics needs a key too
    pivot: Optional[str] = "en"  # the language a pair no model has goes through; None: no pivoting
    max_loaded: Optional[int] = None  # models loaded at once (the least recently used leaves); None: all, at start
    suggestions: Optional[str] = None  # LibreTranslate's POST /suggest stores into this SQLite file; None: off
    files_translation: bool = True  # LibreTranslate's POST /translate_file and GET /download_file/NAME
    file_size_limit: int = 10 * 1024 * 1024  # bytes of one uploaded file; beyond it 413
    files_ttl_s: float = 1800.0  # how long a translated file waits for its download (LibreTranslate's 30 minutes)
    files_dir: Optional[str] = None  # where translated files wait; None: a temporary folder, removed at exit
    glossaries: Optional[str] = None  # stored glossaries' SQLite file (twostep.serving.glossaries); None: in memory

    def __post_init__(self):
        if self.protect_metrics and not self.keyed:
            raise TwostepError(f"protecting /metrics needs API keys: give a key file (--api-key-file, api_key_file=) "
                               f"or a keys database (--api-key-db, api_key_db=), or set {API_KEYS_ENV}")

    @property
    def keyed(self) -> bool:
        """Whether requests need a key: the server has keys (a file's, the environment's, a database's)."""
        return bool(self.api_key_digests or self.api_key_db)


def read_api_keys(path: Optional[Path] = None) -> tuple[bytes, ...]:
    """The SHA-256 digests of the API keys in `path` (one a line; blank lines and # comments ignored) and in
    the environment variable TWOSTEP_API_KEYS (separated by commas); () when neither is given: an open server.
    Digests, not keys, go into ServeConfig, which travels to Ray replicas. A file or variable that is given but
    holds no key is an error, not an open server. No message quotes the file's text."""
    keys = []
    if path is not None:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise TwostepError(f"API key file {path}: {exc.strerror or exc}; give a readable file, "
                               "one key a line") from None
        except UnicodeDecodeError:
            raise TwostepError(f"API key file {path} is not UTF-8 text; give one key a line") from None
        found = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        if not found:
            raise TwostepError(f"API key file {path} holds no key; give one key a line (blank lines and # comments "
                               "are ignored)")
        keys += found
    value = os.environ.get(API_KEYS_ENV)
    if value is not None:
        found = [key.strip() for key in value.split(",") if key.strip()]
        if not found:
            raise TwostepError(f"{API_KEYS_ENV} is set but holds no key; give keys separated by commas, or unset it")
        keys += found
    return tuple(key_digest(key.encode()) for key in keys)


class NotReady(TwostepError):
    """The model is loading, or the server is shutting down: retry (elsewhere)."""


class OverLimit(TooLarge):
    """A request over one of the server's size limits (characters, texts): its `size` and the `limit`."""

    def __init__(self, message: str, size: int, limit: int):
        super().__init__(message)
        self.size, self.limit = size, limit


class RateLimited(TwostepError):
    """A client over its requests a minute (`limit`, as "60 per 1 minute"): retry after `retry_after_s`."""

    def __init__(self, limit: str, retry_after_s: int):
        super().__init__(f"too many requests: {limit}; retry in {retry_after_s} s")
        self.limit, self.retry_after_s = limit, retry_after_s


class PrometheusMetrics(Metrics):
    """The server's metrics: the engine's (Metrics) and each translation API's requests (middleware.RequestLog)."""

    def __init__(self, registry: CollectorRegistry):
        self.requests = Counter("twostep_requests", "HTTP requests to a translation endpoint (api: v1 for "
                                "/v1/translate, libretranslate for /translate), by status.", ["api", "status"],
                                registry=registry)
        self.latency = Histogram("twostep_request_latency_seconds", "Time to answer a translation request (a "
                                 "stream: until its last event).", ["api"],
                                 buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30), registry=registry)
        self.first_event = Histogram("twostep_stream_first_event_seconds", "Time to a stream's first event.",
                                     buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30), registry=registry)
        self.batch_rows = Histogram("twostep_batch_rows", "Rows (sentences x beam) of each decode batch.",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=registry)
        self.batch_sentences = Counter("twostep_batch_sentences", "Sentences put into decode batches.",
                                       registry=registry)
        self.batches = Counter("twostep_batches", "Decode batches started.", registry=registry)
        self.joined_sentences = Counter("twostep_joined_sentences", "Sentences that joined a running batch.",
                                        registry=registry)
        self.steps = Counter("twostep_decoder_steps", "Decoder steps run.", registry=registry)
        self.step_rows = Counter("twostep_decoder_step_rows", "Rows of sentences (sentences x beam) summed over "
                                 "decoder steps: divided by twostep_decoder_steps_total, the mean batch per step.",
                                 registry=registry)
        self.express_steps = Counter("twostep_express_steps", "Decoder steps of the express lane's batch (counted "
                                     "in twostep_decoder_steps_total too).", registry=registry)
        self.tokens = Counter("twostep_generated_tokens", "Tokens generated (best hypothesis of each sentence).",
                              registry=registry)
        self.queue = Gauge("twostep_queue_depth", "Sentences waiting for a batch.", registry=registry)
        self.faults = Counter("twostep_decode_faults", "Times decoding raised, by where: search (a search group's, "
                              "its sentences' own fault) or session (the model's session: its sentences decode again "
                              "in smaller groups).", ["where"], registry=registry)
        for where in ("search", "session"):
            self.faults.labels(where)
        self.retried = Counter("twostep_retried_sentences", "Sentences decoded again after a fault in what they "
                               "shared a batch with.", registry=registry)

    def batch(self, sentences: int, rows: int) -> None:
        self.batches.inc()
        self.batch_sentences.inc(sentences)
        self.batch_rows.observe(rows)

    def joined(self, sentences: int, rows: int) -> None:
        self.joined_sentences.inc(sentences)

    def step(self, rows: int, express: bool = False) -> None:
        self.steps.inc()
        self.step_rows.inc(rows)
        if express:
            self.express_steps.inc()

    def generated(self, tokens: int) -> None:
        self.tokens.inc(tokens)

    def fault(self, where: str, sentences: int, retried: int) -> None:
        self.faults.labels(where).inc()
        self.retried.inc(retried)


@dataclass
class Translated:
    """A request's texts translated along one route: the plan that joins their sentences back into texts, and
    each sentence's hypotheses (the last leg's, best first) with their texts; with a glossary, each sentence's
    terms (None: none found)."""

    plan: DocumentPlan
    results: list[list[Hypothesis]]
    ranked: list[list[str]]
    terms: Optional[list[Optional[Terms]]] = None

    def text_terms(self) -> list[dict[str, list[dict]]]:
        """Each text's glossary terms that its translation holds (`applied_terms`) and those it does not
        (`unmet_terms`: its sentence reached its limit first, or no tokenization of the target could be forced),
        in the order they occur, each {"source", "targets"}: as `twostep translate --glossary --json` reports."""
        terms = self.terms or [None] * len(self.results)
        outcomes = [t.outcome(h[0].unmet if h else ()) if t is not None else ([], [])
                    for t, h in zip(terms, self.results)]
        return [{"applied_terms": [term_json(f) for applied, _ in mine for f in applied],
                 "unmet_terms": [term_json(f) for _, unmet in mine for f in unmet]}
                for mine in self.plan.parts(outcomes)]


def term_json(found: Found) -> dict:
    return {"source": found.entry.source, "targets": list(found.entry.targets)}


Options = Callable[[BatchingTranslator, bool], DecodeOptions]  # (a leg's translator, whether it is the last leg)


class Service:
    """The models behind every API (`catalog`: which answers a pair; `pool`: the loaded ones), opened by
    `lifespan`; `ready` while it takes requests, `draining` once `serve` has had SIGTERM (readiness fails,
    requests are still answered)."""

    def __init__(self, config: ServeConfig, loader: Loader | None = None):
        self.config = config
        self.loader = loader  # what loads and unloads the models (Pool's `loader`); None: the pool, by max_loaded
        self.registry = CollectorRegistry()
        self.metrics = PrometheusMetrics(self.registry)
        self.catalog: Catalog | None = None
        self.pool: Pool | None = None
        self.detector = None  # opened on the first request that asks for detection
        self.keys: KeyDatabase | None = None  # config.api_key_db, opened by lifespan
        self.glossaries: Glossaries | None = None  # config.glossaries (or in memory), opened by lifespan
        self.limiter = None  # the requests a minute of each client (`admit`), made by lifespan where there are any
        self.ready = False
        self.draining = False

    def open_model(self, model: Model) -> tuple[BatchingTranslator, object]:
        """A model's started BatchingTranslator and its backend (in a thread of the pool's: it takes seconds)."""
        config = self.config
        translator, backend = open_batching_translator(model.path, config.backend, limits=config.limits,
                                                       metrics=self.metrics, **({"threads": config.threads}
                                                                                if config.threads else {}))
        advice = batching_advice(backend, config.limits)
        if advice:
            log.warning(advice)
        return translator, backend

    @asynccontextmanager
    async def lifespan(self, app):
        config = self.config
        catalog = Catalog.open([Path(d) for d in config.model_dirs], config.pivot)
        pool = Pool(self.open_model, config.max_loaded, self.loader)
        self.catalog, self.pool = catalog, pool  # the loader's too
        if config.api_key_db:
            self.keys = KeyDatabase(config.api_key_db)
        self.glossaries = Glossaries(config.glossaries)
        if config.api_key_db or config.req_limit:
            from limits.storage import MemoryStorage
            from limits.strategies import MovingWindowRateLimiter

            self.limiter = MovingWindowRateLimiter(MemoryStorage())
        for model in catalog.models[:config.max_loaded]:
            await pool.load(model)
        self.metrics.queue.set_function(pool.queue_depth)
        self.ready = True
        log.info("serving %d model%s (%s), limits %s", len(catalog.models), "s" * (len(catalog.models) > 1),
                 ", ".join(m.name for m in catalog.models), asdict(config.limits))
        try:
            yield
        finally:
            self.ready = False
            await pool.close()  # queued and running sentences finish first
            if self.keys is not None:
                self.keys.close()
            self.glossaries.close()
            log.info("stopped")

    @property
    def retry_after(self) -> dict[str, str]:
        return {"Retry-After": str(self.config.retry_after_s)}

    @property
    def backend_name(self) -> str:
        loaded = list(self.pool.loaded.values()) if self.pool else []
        return loaded[0].backend.name if loaded else (self.config.backend or "ort-cpu")

    def running(self) -> Catalog:
        """The catalog of models, or NotReady while they load or once the server is shutting down."""
        if not self.ready:
            raise NotReady("not ready: the model is loading or the server is shutting down")
        return self.catalog

    def route(self, source: str | None, target: str | None) -> Route:
        return self.running().route(source, target)

    def key_limits(self, key: bytes) -> KeyLimits | None:
        """The limits of `key` if it is one of the server's, else None: a key file's (or TWOSTEP_API_KEYS')
        has the server's limits, a database's its own (twostep.serving.keys)."""
        if known_key(self.config.api_key_digests, key):
            return KeyLimits()
        return self.keys.lookup(key) if self.keys is not None else None

    def admit(self, scope, key: bytes | None, own: KeyLimits | None = None, cost: int = 1) -> int:
        """Count a request of `cost` (a list's texts, as LibreTranslate counts them) against its client's requests
        a minute, in a moving window: its key's own (`own`), else the server's req_limit; the client is its
        key where it sent one, else its address (the ASGI `scope`'s client: behind a proxy that uvicorn trusts,
        FORWARDED_ALLOW_IPS, the proxy's X-Forwarded-For). RateLimited beyond. The characters the request
        may hold: its key's, else max_chars. LibreTranslate's get_req_limits and get_char_limit."""
        own = own or KeyLimits()
        req_limit = own.req_limit or self.config.req_limit
        if req_limit and self.limiter is not None:
            from limits import RateLimitItemPerMinute

            item = RateLimitItemPerMinute(req_limit)
            client = key_digest(key).hex() if key is not None else (scope.get("client") or ("unknown",))[0]
            if not self.limiter.hit(item, client, cost=cost):
                reset = self.limiter.get_window_stats(item, client).reset_time
                raise RateLimited(str(item), max(1, math.ceil(reset - time.time())))
        return own.char_limit or self.config.max_chars

    def owner(self, key: bytes | None) -> bytes:
        """Whose glossaries a request sees: its key's (its digest) where the server has keys; b"" on an open
        server."""
        return key_digest(key) if key is not None and self.config.keyed else b""

    def glossary(self, key: bytes | None, entries: Sequence[Entry] | None,
                 glossary_id: str | None) -> tuple[Glossary | None, Stored | None]:
        """A translation request's glossary: its own `entries`, or its key's stored one (`glossary_id`), not both;
        (None, None) for neither. BadInput for a glossary that is not one (Glossary's checks), or an unknown id."""
        if entries is not None and glossary_id is not None:
            raise BadInput("give a glossary's entries (glossary) or a stored one's id (glossary_id), not both")
        if glossary_id is not None:
            stored = self.glossaries.get(self.owner(key), glossary_id)
            return stored.glossary(), stored
        return (Glossary(entries), None) if entries is not None else (None, None)

    def check_size(self, texts: Sequence, unit: str = "characters", limit: int | None = None) -> None:
        """A request's size against `limit` (None: max_chars): characters of all its texts, or token ids;
        OverLimit beyond."""
        size, limit = sum(map(len, texts)), limit or self.config.max_chars
        if size > limit:
            raise OverLimit(f"{size} {unit} in one request; at most {limit}", size, limit)

    def check_batch(self, texts: Sequence) -> None:
        """A request's texts against batch_limit: OverLimit beyond."""
        if self.config.batch_limit is not None and len(texts) > self.config.batch_limit:
            raise OverLimit(f"{len(texts)} texts in one request; at most {self.config.batch_limit}", len(texts),
                            self.config.batch_limit)

    def check_sentences(self, count: int) -> None:
        """A request's sentences (after documents are split) against max_sentences: TooLarge beyond."""
        if count > self.config.max_sentences:
            raise TooLarge(f"{count} sentences in one request; at most {self.config.max_sentences}")

    def encode(self, translator: BatchingTranslator, texts: Sequence[str], src_lang: str | None,
               tgt_lang: str | None, split: bool = True,
               max_chars: int | None = None) -> tuple[list[list[int]], DocumentPlan]:
        """Texts to the source ids of their sentences, checked against the admission limits (max_chars, or the
        client's `max_chars` (`admit`), before, max_sentences after splitting), and the plan that joins the
        sentences' translations back into texts. `split`: each text a document, split into sentences
        (twostep.runtime.documents); else each text one sentence."""
        self.check_size(texts, limit=max_chars)
        self.check_sentences(len(texts))  # before the work of splitting, as after it
        if split:
            sources, plan = translator.translator.encode_documents(texts, src_lang, tgt_lang)
        else:
            sources, plan = translator.encode(texts, src_lang, tgt_lang), DocumentPlan.sentences_of(texts)
        self.check_sentences(len(sources))
        return sources, plan

    def submit(self, translator: BatchingTranslator, sources: Sequence[Sequence[int]], options: DecodeOptions,
               tgt_lang: str | None = None, constraints: Sequence | None = None) -> Future:
        """Queue checked token ids (BatchingTranslator.submit_ids, `constraints` each sentence's): BadInput,
        TooLarge or Overloaded else."""
        self.check_sentences(len(sources))
        return translator.submit_ids(sources, options, tgt_lang, constraints=constraints)

    async def translate(self, texts: Sequence[str], route: Route, options: Options, split: bool = True,
                        request=None, max_chars: int | None = None,
                        glossary: Glossary | None = None) -> Translated | None:
        """`texts` translated along `route`: its first leg's sentences (each text a document with `split`) are
        queued in that model's running batches; a pivot's second leg takes each sentence's best translation as
        one sentence of its own. `options(translator, last)`: how each leg decodes. None once the client (the
        Starlette `request`, if given) has gone away: its rows were dropped. Raises what a leg is refused or
        fails with. `max_chars`: the client's (`admit`); None: the server's.

        `glossary`: its terms are found in the first leg's source sentences and enforced on the last leg (into
        the target language), in the last model's target tokenization (Translator.sentence_terms); a sentence
        without a term decodes as without it. Not with sampling (BadInput)."""
        if not route.legs:  # one language: the texts as they came
            self.check_size(texts, limit=max_chars)
            return Translated(DocumentPlan.sentences_of(texts), [[Hypothesis([], 0.0)] for _ in texts],
                              [[t] for t in texts])
        plan, current, results, ranked, terms = None, list(texts), [], [], None
        for i, leg in enumerate(route.legs):
            async with self.pool.use(leg.model) as translator:
                last = i == len(route.legs) - 1
                opts = options(translator, last)
                if plan is None:
                    sources, plan = self.encode(translator, current, leg.source, leg.target, split, max_chars)
                else:
                    sources = translator.encode(current, leg.source, leg.target)
                constraints = None
                if glossary is not None and last:
                    if opts.sampling:
                        raise BadInput("a glossary needs beam search or greedy decoding, not sampling")
                    terms = translator.translator.sentence_terms(plan.sentences, glossary)
                    constraints = [t.constraints if t is not None else None for t in terms]
                future = asyncio.wrap_future(self.submit(translator, sources, opts, leg.target, constraints))
                results = await (until_disconnected(future, request) if request is not None else future)
                if results is None:
                    return None
                results = await translator.replace_unknowns_async(sources, results, opts, leg.target)
                ranked = [[translator.translator.text(h) for h in hyps] for hyps in results]
                current = [r[0] if r else "" for r in ranked]
        return Translated(plan, results, ranked, terms)

    async def detect(self, texts: Sequence[str],
                     languages: Sequence[str] | None = None) -> list[list[tuple[str, float]]]:
        """Each text's language among `languages` (standard tags; by default those the server translates from):
        candidates best first, (tag, confidence 0-100); [] where none matches (twostep.runtime.detect). In a
        thread: it takes a while."""
        from twostep.runtime.detect import open_detector

        languages = self.running().source_tags() if languages is None else list(languages)
        if self.detector is None:
            self.detector = open_detector()
        return await asyncio.to_thread(self.detector.detect, list(texts), languages)

    async def sources_of(self, texts: Sequence[str], field: str, languages: Sequence[str] | None = None,
                         ) -> tuple[list[tuple[str, float]], dict[str, list[int]]]:
        """Each text's detected language, (tag, confidence), for a request whose `field` says auto, among
        `languages` (by default those the server translates from), and the texts' indices by language (each
        language is one route). Where nothing matches: the server's one source language with confidence 0, as
        LibreTranslate translates what it cannot detect; among several, a BadInput that asks for `field`."""
        sources = self.running().source_tags()
        among = sources if languages is None else list(languages)
        out = []
        for i, candidates in enumerate(await self.detect(texts, among)):
            if not candidates and len(sources) != 1:
                which = "those this server translates from" if languages is None else "this server's languages"
                raise BadInput(f"the language of text {i + 1} is none of {which} ({', '.join(among)}): name the "
                               f"{field}")
            out.append(candidates[0] if candidates else (sources[0], 0.0))
        by_language: dict[str, list[int]] = {}
        for i, (tag, _) in enumerate(out):
            by_language.setdefault(tag, []).append(i)
        return out, by_language


@dataclass(frozen=True)
class Refused:
    """How an API words the service's refusals: a status for each kind of error (the first that the error is
    an instance of), and the error's message in a JSON body {"error": ...}; Retry-After with 503 and 429 (a
    RateLimited's own seconds). A
    request whose decode raised (engine.Faulted: logged with its traceback where it happened) is a 500."""

    statuses: Mapping[type, int]
    words: Mapping[type, Callable[[Exception], str]] = field(default_factory=dict)  # the API's own, by kind

    def status(self, exc: Exception) -> int:
        return next((status for kind, status in self.statuses.items() if isinstance(exc, kind)), 400)

    def response(self, service: Service, exc: Exception, message: str | None = None):
        status = self.status(exc)
        worded = next((words for kind, words in self.words.items() if isinstance(exc, kind)), None)
        message = message or (worded(exc) if worded else None)
        retry = ({"Retry-After": str(exc.retry_after_s)} if isinstance(exc, RateLimited) else
                 service.retry_after if status in (429, 503) else {})
        return error(status, message or str(exc), **retry)


V1_REFUSED = Refused({Faulted: 500, NotReady: 503, Overloaded: 503, RateLimited: 429, TooLarge: 413, BadInput: 400,
                      TwostepError: 400})
FAILED = (TwostepError, Faulted)  # what a request's decode ends with other than its answer: each API words it


def error(status: int, message: str, **headers):
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=status, headers=headers or None)


async def until_disconnected(pending: asyncio.Future, request):
    """The result of `pending`, or None (and `pending` cancelled) once the client has disconnected: a task waits
    for the ASGI server's http.disconnect (the request's body is read by then), as Starlette's streaming responses
    do. (Polling request.is_disconnected() every 50 ms took 6% of a loaded server's GIL at 32 clients.)"""
    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    listener = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({pending, listener}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        listener.cancel()
    if pending in done:
        return pending.result()
    if listener.exception() is not None:  # an ASGI server whose receive fails: no disconnects to hear
        return await pending
    pending.cancel()
    return None

