"""`twostep serve`: one model or many (twostep.serving.models), each a BatchingTranslator, behind HTTP (FastAPI on
uvicorn), with Prometheus metrics.

`build_app` composes the APIs, each a router over one Service (twostep.serving.service): twostep's own
(twostep.serving.api.v1: POST /v1/translate, GET /v1/languages), LibreTranslate's (api.libretranslate: POST
/translate, /detect, GET /languages, /frontend/settings, /health, /spec) and operations' (api.ops: GET /healthz,
/readyz, /metrics), with the middleware they share (twostep.serving.middleware): API keys, per-API request
metrics, draining, a log line per request, a JSON 500 for a bug. Every error of every API is {"error": ...}: the
APIs' own, Starlette's (404, 405, a malformed form) and a bug's. The API docs are at /docs and /openapi.json
(`api_document`: FastAPI's, with the server's ranges, bodies and languages). The web page (web/: index.html at /,
what it loads at /static/) translates as one types, through LibreTranslate's API; it is not in the API document.

With API keys (`read_api_keys`, or a keys database: twostep.serving.keys) every path but /healthz, /readyz, the
API docs, the web page, LibreTranslate's open ones and (unless `protect_metrics`) /metrics needs `Authorization:
Bearer KEY`: 401 otherwise; LibreTranslate's /translate and /detect take the key in their `api_key` field too. The
models are opened in the app's lifespan, so the same app runs under uvicorn (`serve`) and as a Ray Serve ingress
(`twostep.serving.ray_app`). On SIGTERM `serve` first drains for `shutdown_delay_s`, if given: /readyz answers 503
at once while requests are still answered (with `Connection: close`), so that load balancers stop sending them
here; then uvicorn stops accepting, answers what is in flight, and the lifespan closes the models. A second
SIGTERM or Ctrl-C skips the delay.
"""

from __future__ import annotations

import copy
import logging
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import disable_created_metrics
from starlette.exceptions import HTTPException
from starlette.routing import compile_path
from uvicorn.config import STARTUP_FAILURE

from twostep.serving.api import libretranslate, ops, v1
from twostep.serving.middleware import Drain, RequestLog, RequireKey, ServerErrors, is_open
from twostep.serving.models import Loader
from twostep.serving.service import API_KEYS_ENV, ServeConfig, Service, error, read_api_keys

log = logging.getLogger("twostep.serving")
WEB = Path(__file__).with_name("web")  # the web page: index.html, and the files it loads from /static/
PAGE_PATHS = {"/", *(f"/static/{file.name}" for file in WEB.iterdir())}
OPEN_PATHS = {"/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc",
              *libretranslate.OPEN, *PAGE_PATHS}


def build_app(config: ServeConfig, loader: Optional[Loader] = None) -> FastAPI:
    """The APIs over one Service, with the shared middleware; `app.state.service` is the service. `loader`: what
    loads and unloads its models (twostep.serving.ray_app's, through Ray Serve); None: the service's pool."""
    disable_created_metrics()
    service = Service(config, loader)
    app = FastAPI(title="twostep", summary="Encoder-decoder Transformer translation (two ONNX graphs, KV cache).",
                  version="1", lifespan=service.lifespan)
    app.state.service = service
    for api in (v1, libretranslate, ops):
        app.include_router(api.router(service))

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(WEB / "index.html")

    app.mount("/static", StaticFiles(directory=WEB), name="static")

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        if "json" not in request.headers.get("content-type", ""):
            return error(400, "bad request: send a JSON object with Content-Type: application/json")
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            return error(400, "bad request: the body is not valid JSON")
        problems = "; ".join(f"{'.'.join(map(str, e['loc'][1:])) or 'body'}: {e['msg']}" for e in exc.errors())
        return error(400, f"bad request: {problems}")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        """Starlette's own refusals (no such path, a method the path does not take, a malformed form) in the
        APIs' shape, {"error": ...}, with their headers (405's Allow: every method the API document gives the
        path, where Starlette names its first route's only)."""
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            methods = {method.upper() for template, operations in app.openapi()["paths"].items()
                       if compile_path(template)[0].match(request.url.path) for method in operations}
            headers["Allow"] = ", ".join(sorted(methods)) or headers.get("Allow", "")
        return error(exc.status_code, refusal(request, exc.status_code, exc.detail, headers.get("Allow")),
                     **headers)

    app.openapi = api_document(app, service)

    # the last added is the outermost: the log and the metrics see every request, the 401s too
    if config.keyed:
        open_paths = OPEN_PATHS | libretranslate.PATHS  # which take their key in the body too, and check it
        app.add_middleware(RequireKey, known=lambda key: service.key_limits(key) is not None,
                           open_paths=open_paths if config.protect_metrics else open_paths | {"/metrics"})
    app.add_middleware(Drain, draining=lambda: service.draining)
    app.add_middleware(RequestLog, apis={"/v1/translate": "v1", "/translate": "libretranslate"},
                       counter=service.metrics.requests, histogram=service.metrics.latency)
    app.add_middleware(ServerErrors)
    return app


def api_document(app: FastAPI, service: Service) -> Callable[[], dict]:
    """The app's `openapi()`: FastAPI's document of the routes, with what FastAPI cannot know. Every error is
    {"error": ...} (api.Error): a request FastAPI finds invalid is a 400, never its 422; any operation may answer
    500 (a bug); with API keys, every path but the open ones 401. Each API states its own (`describe`): v1 its
    options' ranges, LibreTranslate its bodies and languages. Made once before the models are open and once
    after, when the language codes a request may name are known, and kept."""
    generated = app.openapi  # FastAPI's, from the routes, made once
    documents: dict[bool, dict] = {}

    def openapi() -> dict:
        ready = service.ready
        if ready not in documents:
            document = copy.deepcopy(generated())
            schemas = document.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            error = {"description": "A bug, or a request whose decode raised: its traceback is in the server's log",
                     "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            config = service.config
            open_paths = OPEN_PATHS | ({"/metrics"} if not config.protect_metrics else set())
            if config.keyed:
                document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            for path, operations in document["paths"].items():
                for operation in operations.values():
                    operation["responses"].pop("422", None)
                    operation["responses"].setdefault("500", error)
                    if not config.keyed or is_open(path, open_paths):
                        continue
                    if path in libretranslate.PATHS:  # the key in the body (api_key) or the header
                        operation["security"] = [{"bearer": []}, {}]
                    else:
                        operation["security"] = [{"bearer": []}]
                        operation["responses"].setdefault("401", {**error, "description": "No key, or not one of "
                                                                  "the server's: send Authorization: Bearer KEY"})
            v1.describe(document, service)
            libretranslate.describe(document, service)
            documents[ready] = document
        return documents[ready]

    return openapi


def refusal(request: Request, status: int, detail, allowed: str | None) -> str:
    """The message of one of Starlette's refusals: what was asked, and what the server takes instead."""
    what = f"{request.method} {request.url.path}"
    if status == 404:
        return f"not found: {what}; this server's paths are listed at /openapi.json (and /docs)"
    if status == 405:
        return f"method not allowed: {what}; the path takes {allowed or 'other methods'}"
    return str(detail)


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
    serve_app(build_app(config), host, port, shutdown_delay_s)


def serve_app(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, shutdown_delay_s: float = 0) -> None:
    """`serve` for an app that `build_app` made (with routes of one's own added, say)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    server = DrainingServer(uvicorn.Config(app, host=host, port=port, log_level="info", access_log=False,
                                           timeout_graceful_shutdown=60),
                            shutdown_delay_s, draining=lambda: setattr(app.state.service, "draining", True))
    try:
        server.run()
    except KeyboardInterrupt:  # as uvicorn.run does
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)


__all__ = ["API_KEYS_ENV", "ServeConfig", "build_app", "read_api_keys", "serve", "serve_app"]
