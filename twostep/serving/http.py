"""`twostep serve`: one BatchingTranslator behind HTTP (FastAPI on uvicorn), with Prometheus metrics.

    POST /v1/translate   {"text": [...]} or {"ids": [[...], ...]}, with decoding options -> hypotheses
    GET  /healthz        alive          GET /readyz   model loaded and taking requests
    GET  /metrics        Prometheus text format      GET /openapi.json, /docs

Bad JSON or fields: 400; too many sentences or characters: 413; queue full or shutting down: 503 with
Retry-After. With API keys (`read_api_keys`) every path but /healthz, /readyz, the API docs and (unless
`protect_metrics`) /metrics needs `Authorization: Bearer KEY`: 401 otherwise. The model is opened in the
app's lifespan, so the same app runs under uvicorn (`serve`) and as a Ray Serve ingress
(`twostep.serving.ray_app`). On SIGTERM `serve` first drains for `shutdown_delay_s`, if given: /readyz
answers 503 at once while requests are still answered, so that load balancers stop sending them here; then
uvicorn stops accepting, answers what is in flight, and the lifespan closes the translator. A second
SIGTERM or Ctrl-C skips the delay.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, Field
from uvicorn.config import STARTUP_FAILURE

from twostep.artifact.tokenizer import Languages, MissingLanguage, model_tag
from twostep.errors import BadInput, Overloaded, TooLarge, TwostepError
from twostep.runtime.decoding import DecodeOptions
from twostep.serving.engine import Metrics
from twostep.serving.executor import batching_advice, open_batching_translator
from twostep.serving.limits import BatchLimits

log = logging.getLogger("twostep.serving")
API_KEYS_ENV = "TWOSTEP_API_KEYS"  # keys separated by commas, beside or instead of a key file


@dataclass(frozen=True)
class ServeConfig:
    """What a server (or each Ray Serve replica) opens: picklable, so it travels to replicas."""

    model_dir: str
    backend: Optional[str] = None
    threads: Optional[int] = None
    limits: BatchLimits = field(default_factory=BatchLimits)
    max_sentences: int = 64  # per request
    max_chars: int = 20_000  # per request, all sentences together
    retry_after_s: int = 1
    api_key_digests: tuple[bytes, ...] = field(default=(), repr=False)  # read_api_keys'; () is an open server
    protect_metrics: bool = False  # /metrics needs a key too

    def __post_init__(self):
        if self.protect_metrics and not self.api_key_digests:
            raise TwostepError(f"protecting /metrics needs API keys: give a key file (--api-key-file, api_key_file=) "
                               f"or set {API_KEYS_ENV}")


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
    return tuple(hashlib.sha256(key.encode()).digest() for key in keys)


class TranslateRequest(BaseModel):
    """Sentences as text, or as token ids (each ending with eos), and how to decode them."""

    model_config = ConfigDict(extra="forbid")
    text: Optional[list[str]] = Field(None, description="Sentences to translate.")
    ids: Optional[list[list[int]]] = Field(None, description="Token ids instead of text, each ending with eos.")
    beam: int = Field(1, description="Beam size; 1 is greedy.")
    n_best: int = 1
    length_penalty: float = 1.0
    max_new_tokens: Optional[int] = Field(None, description="Default: 2 x source length + 16.")
    sampling: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = None
    suppress_eos: bool = Field(False, description="Never end at eos: max_new_tokens tokens each (benchmarks).")
    beam_stop: str = Field("n_best", description="Beam search's stopping rule: n_best, or transformers (as its "
                           "generate() stops: keeps beam finished hypotheses).")
    src_lang: Optional[str] = Field(None, description="Source language code, for multilingual models (M2M100: en; "
                                    "NLLB: eng_Latn; mBART-50: en_XX).")
    tgt_lang: Optional[str] = Field(None, description="Target language code (M2M100: fr; NLLB: fra_Latn; mBART-50: "
                                    "fr_XX; Marian: fra for >>fra<<).")

    def options(self) -> DecodeOptions:
        return DecodeOptions(beam_size=self.beam, n_best=self.n_best, length_penalty=self.length_penalty,
                             max_new_tokens=self.max_new_tokens, sampling=self.sampling, temperature=self.temperature,
                             top_k=self.top_k, top_p=self.top_p, seed=self.seed, suppress_eos=self.suppress_eos,
                             beam_stop=self.beam_stop)


class Hypothesis(BaseModel):
    text: Optional[str] = Field(None, description="Absent for requests sent as ids.")
    tokens: list[int]
    score: float


class TranslateResponse(BaseModel):
    translations: list[list[Hypothesis]] = Field(description="Per sentence, in request order: n_best hypotheses.")


class PrometheusMetrics(Metrics):
    def __init__(self, registry: CollectorRegistry):
        self.requests = Counter("twostep_requests", "HTTP requests to /v1/translate, by status.", ["status"],
                                registry=registry)
        self.latency = Histogram("twostep_request_latency_seconds", "Time to answer /v1/translate.",
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


def error(status: int, message: str, **headers) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers or None)


def described(code: str) -> dict:
    """A model's language code with its standard BCP-47 tag and English name (None where it has none)."""
    import langcodes

    try:
        tag = model_tag(code)
        name = langcodes.Language.get(tag).display_name()
    except (ValueError, LookupError, ImportError):  # not a tag; or the names' package (language-data) is missing
        return {"code": code, "tag": None, "name": None}
    return {"code": code, "tag": tag, "name": name}


def language_list(languages: Languages | None) -> dict:
    """GET /v1/languages: the codes the model takes (a request may also name them by a standard code, see
    twostep.artifact.tokenizer.standard_matches), each source with the targets it translates to. A model without
    source codes takes its source text as it is; one without target codes (a bilingual Marian) translates to its
    one language."""
    if languages is None:
        return {"source": [], "target": [], "default_source": None, "default_target": None}
    targets = sorted(languages.target)
    return {"source": [{**described(code), "targets": targets} for code in sorted(languages.source)],
            "target": [described(code) for code in targets],
            "default_source": languages.default_source, "default_target": languages.default_target}


def build_app(config: ServeConfig) -> FastAPI:
    disable_created_metrics()
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    state: dict = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        translator, backend = open_batching_translator(Path(config.model_dir), config.backend, limits=config.limits,
                                                       metrics=metrics, **({"threads": config.threads}
                                                                           if config.threads else {}))
        metrics.queue.set_function(lambda: translator.queue_depth)
        state.update(translator=translator, backend=backend, ready=True)
        log.info("serving %s on %s, decoding with its %s graph (%s)", config.model_dir, backend.name, backend.decoder,
                 asdict(config.limits))
        advice = batching_advice(backend, config.limits)
        if advice:
            log.warning(advice)
        try:
            yield
        finally:
            state["ready"] = False
            await asyncio.to_thread(translator.close)  # queued and running sentences finish first
            backend.close()
            log.info("stopped")

    app = FastAPI(title="twostep", summary="Encoder-decoder Transformer translation (two ONNX graphs, KV cache).",
                  version="1", lifespan=lifespan)
    app.state.draining = False  # set by `serve` on SIGTERM: /readyz answers 503, requests are still answered

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        if request.url.path == "/v1/translate":
            metrics.requests.labels("400").inc()
        if "json" not in request.headers.get("content-type", ""):
            return error(400, "bad request: send a JSON object with Content-Type: application/json")
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            return error(400, "bad request: the body is not valid JSON")
        problems = "; ".join(f"{'.'.join(map(str, e['loc'][1:])) or 'body'}: {e['msg']}" for e in exc.errors())
        return error(400, f"bad request: {problems}")

    if config.api_key_digests:
        def refused(path: str) -> None:
            if path == "/v1/translate":
                metrics.requests.labels("401").inc()

        open_paths = {"/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
        app.add_middleware(RequireKey, digests=config.api_key_digests, refused=refused,
                           open_paths=open_paths if config.protect_metrics else open_paths | {"/metrics"})
    app.add_middleware(RequestLog)  # added last, so outermost: it logs the 401s too

    @app.post("/v1/translate", response_model=TranslateResponse,
              responses={400: {"description": "Bad JSON, fields or input"}, 413: {"description": "Too large"},
                         503: {"description": "Queue full or shutting down; see Retry-After"}})
    async def translate(body: TranslateRequest, request: Request):
        started = time.perf_counter()
        response = await answer(body, request)
        if app.state.draining:  # a client (or load balancer) that keeps its connection open reconnects elsewhere
            response.headers["Connection"] = "close"
        metrics.requests.labels(str(response.status_code)).inc()
        metrics.latency.observe(time.perf_counter() - started)
        return response

    async def answer(body: TranslateRequest, request: Request) -> Response:
        translator = state.get("translator")
        busy = {"Retry-After": str(config.retry_after_s)}
        if not state.get("ready"):
            return error(503, "not ready: the model is loading or the server is shutting down", **busy)
        if (body.text is None) == (body.ids is None):
            return error(400, "bad request: give either text or ids")
        sentences = body.text if body.text is not None else body.ids
        if len(sentences) > config.max_sentences:
            return error(413, f"{len(sentences)} sentences in one request; at most {config.max_sentences}")
        chars = sum(map(len, body.text)) if body.text is not None else sum(map(len, body.ids))
        if chars > config.max_chars:
            unit = "characters" if body.text is not None else "token ids"
            return error(413, f"{chars} {unit} in one request; at most {config.max_chars}")
        try:
            options = body.options()
            if body.text is not None:
                sources = translator.encode(body.text, body.src_lang, body.tgt_lang)
            else:
                sources = body.ids
            future = translator.submit_ids(sources, options, body.tgt_lang)
        except Overloaded as exc:
            return error(503, str(exc), **busy)
        except TooLarge as exc:  # beyond --max-request-work
            return error(413, str(exc))
        except MissingLanguage as exc:  # named as the request's field, not the CLI's option
            return error(400, exc.worded(MissingLanguage.FIELDS[exc.side]))
        except BadInput as exc:
            return error(400, str(exc))
        try:
            results = await until_disconnected(asyncio.wrap_future(future), request)
        except TwostepError as exc:  # raised while decoding: an engine profile's limit, say
            return error(400, str(exc))
        if results is None:  # the client went away; its rows were dropped
            return Response(status_code=499)
        # TranslateResponse's shape, built as plain JSON: validating our own output per request buys nothing
        if body.text is None:
            return JSONResponse({"translations": [[{"tokens": h.tokens, "score": h.score} for h in hyps]
                                                  for hyps in results]})
        decode = translator.tokenizer.decode
        return JSONResponse({"translations": [[{"text": decode(h.tokens), "tokens": h.tokens, "score": h.score}
                                               for h in hyps] for hyps in results]})

    @app.get("/v1/languages")
    async def languages():
        if not state.get("ready"):
            return error(503, "not ready: the model is loading or the server is shutting down",
                         **{"Retry-After": str(config.retry_after_s)})
        tokenizer = state["translator"].tokenizer
        return language_list(tokenizer.spec.languages if tokenizer else None)

    @app.get("/healthz")
    async def healthz():
        return {"status": "alive"}

    @app.get("/readyz")
    async def readyz():
        if not state.get("ready"):
            return error(503, "not ready")
        if app.state.draining:
            return error(503, "draining: shutting down soon")
        return {"status": "ready", "backend": state["backend"].name}

    @app.get("/metrics")
    async def metrics_endpoint():
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


class RequestLog:
    """One log line per HTTP request: method, path, status, milliseconds. Plain ASGI (Starlette's
    BaseHTTPMiddleware costs a task and a stream per request)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            log.info("%s %s %d %.1f ms", scope["method"], scope["path"], status[0],
                     1000 * (time.perf_counter() - started))


class RequireKey:
    """401 (with `WWW-Authenticate: Bearer`) for a request without `Authorization: Bearer KEY` of one of the
    server's keys, on every path but `open_paths`; plain ASGI, so that no body is read first. The digest of
    the key sent is compared with every key's, each in constant time and with no early exit: the time taken
    tells neither whether nor which key matched. `refused(path)` is called for each 401."""

    def __init__(self, app, digests: tuple[bytes, ...], open_paths: set[str], refused: Callable[[str], None]):
        self.app, self.digests, self.open_paths, self.refused = app, digests, open_paths, refused

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, root = scope["path"], scope.get("root_path", "")
        path = path[len(root):] if root and path.startswith(root) else path  # as routed (Ray: under a prefix)
        if path in self.open_paths or self.allowed(dict(scope["headers"]).get(b"authorization", b"")):
            return await self.app(scope, receive, send)
        self.refused(path)
        response = error(401, "unauthorized: send the header Authorization: Bearer KEY, with a key of this server",
                         **{"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)

    def allowed(self, header: bytes) -> bool:
        scheme, _, key = header.strip().partition(b" ")
        digest = hashlib.sha256(key.strip()).digest()
        matches = [hmac.compare_digest(digest, known) for known in self.digests]  # all of them, always
        return scheme.lower() == b"bearer" and any(matches)


async def until_disconnected(pending: asyncio.Future, request: Request, poll_s: float = 0.05):
    """The result of `pending`, or None (and `pending` cancelled) once the client has disconnected."""
    while True:
        done, _ = await asyncio.wait({pending}, timeout=poll_s)
        if done:
            return pending.result()
        if await request.is_disconnected():
            pending.cancel()
            return None


class DrainingServer(uvicorn.Server):
    """uvicorn's Server with a drain before it closes. On the first SIGTERM `draining()` is called (the app's
    /readyz answers 503 from then on) and the listener stays open, answering requests, for `delay_s`, while
    load balancers take this server out of their lists; then uvicorn's shutdown: it stops accepting, answers
    what is in flight, closes the app. A second SIGTERM or a SIGINT (Ctrl-C) ends the delay at once; a SIGINT
    during the shutdown stops waiting for requests in flight. Unlike uvicorn's Server it does not raise the
    signal again once done: a server that stopped as asked exits 0."""

    def __init__(self, config: uvicorn.Config, delay_s: float, draining: Callable[[], None]):
        super().__init__(config)
        self.delay_s, self.draining = delay_s, draining
        self.drain_until: Optional[float] = None
        self.drain_logged = False

    def handle_exit(self, sig: int, frame) -> None:  # a signal handler: sets flags, logs nothing
        if sig == signal.SIGTERM and self.delay_s > 0 and self.drain_until is None and not self.should_exit:
            self.drain_until = time.monotonic() + self.delay_s
            self.draining()
        elif self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True

    async def on_tick(self, counter: int) -> bool:  # every 0.1 s
        if self.drain_until is not None and not self.drain_logged:
            self.drain_logged = True
            log.info("draining: /readyz answers 503; requests are answered for %g s more, then the listener closes "
                     "(SIGTERM again or Ctrl-C: now)", self.delay_s)
        if self.drain_until is not None and time.monotonic() >= self.drain_until:
            self.should_exit = True
        return await super().on_tick(counter)


def serve(config: ServeConfig, host: str = "127.0.0.1", port: int = 8000, shutdown_delay_s: float = 0) -> None:
    """Run the server until SIGINT or SIGTERM; in-flight requests are answered before it exits. On SIGTERM,
    `shutdown_delay_s` of draining first (DrainingServer)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = build_app(config)
    server = DrainingServer(uvicorn.Config(app, host=host, port=port, log_level="info", access_log=False,
                                           timeout_graceful_shutdown=60),
                            shutdown_delay_s, draining=lambda: setattr(app.state, "draining", True))
    try:
        server.run()
    except KeyboardInterrupt:  # as uvicorn.run does
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)


__all__ = ["API_KEYS_ENV", "ServeConfig", "build_app", "read_api_keys", "serve"]
