"""The middleware every API of `twostep serve` shares, each plain ASGI (Starlette's BaseHTTPMiddleware costs a
task and a stream per request, and reads bodies it need not): a JSON 500 for an unexpected exception, its
traceback logged once (ServerErrors), one log line per request, with each translation API's request count and
latency (RequestLog), `Connection: close` while draining (Drain), and API keys (RequireKey)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

log = logging.getLogger("twostep.serving")


def internal_error(exc: BaseException) -> str:
    """What a client is told of an unexpected exception (a bug): its type, not its message, which may hold what
    the server keeps to itself."""
    return f"internal error: {type(exc).__name__} (a bug in the server; its log has the traceback)"


class ServerErrors:
    """A 500 `{"error": ...}` (internal_error) for an exception that escapes the app: a route's, an exception
    handler's, or the middleware's inside this one (the outermost of ours); its traceback is logged here, once.
    It is not raised on: Starlette's ServerErrorMiddleware would answer it in plain text (or, with an Exception
    handler, still raise it again) and uvicorn would log its traceback a second time. An exception after the
    response started (its body cut short) is logged, and the server closes the connection (uvicorn: "ASGI
    callable returned without completing response"), so that a client never takes a cut body for a whole one."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def sending(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            log.exception("%s %s failed: %s", scope["method"], scope["path"], internal_error(exc))
            if not started:
                from twostep.serving.service import error

                await error(500, internal_error(exc))(scope, receive, send)


def routed_path(scope) -> str:
    """The path as routed: under Ray Serve the app runs below a prefix (root_path)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


class RequestLog:
    """One log line per HTTP request (method, path, status, milliseconds) and, for the paths of `apis` (path ->
    the translation API's label), its count by status and its latency (to the end of the body: a stream's last
    event) in `counter` and `histogram`, labelled (api, status) and (api,); 499 for a client that went away first,
    500 for an exception before the response started (ServerErrors, outside, answers it)."""

    def __init__(self, app, apis: Mapping[str, str], counter, histogram):
        self.app, self.apis, self.counter, self.histogram = app, apis, counter, histogram

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        api = self.apis.get(routed_path(scope))
        started, status = time.perf_counter(), [None]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            status[0] = status[0] or 500
            raise
        finally:
            status[0] = status[0] or (499 if api else 500)
            seconds = time.perf_counter() - started
            if api is not None:
                self.counter.labels(api, str(status[0])).inc()
                self.histogram.labels(api).observe(seconds)
            log.info("%s %s %d %.1f ms", scope["method"], scope["path"], status[0], 1000 * seconds)


class Drain:
    """While `draining()`, every response says `Connection: close`: a client (or load balancer) that keeps its
    connection open reconnects elsewhere."""

    def __init__(self, app, draining: Callable[[], bool]):
        self.app, self.draining = app, draining

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def sending(message):
            if message["type"] == "http.response.start" and self.draining():
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, sending)


def bearer_key(scope) -> bytes | None:
    """The key of an `Authorization: Bearer KEY` header, else None."""
    scheme, _, key = dict(scope["headers"]).get(b"authorization", b"").strip().partition(b" ")
    return key if scheme.lower() == b"bearer" and key.strip() else None


def is_open(path: str, open_paths: set[str]) -> bool:
    """Whether a path is one of `open_paths`, or under a folder of them written FOLDER/* (/download_file/*)."""
    return path in open_paths or any(path.startswith(p[:-1]) for p in open_paths if p.endswith("/*"))


class RequireKey:
    """401 (with `WWW-Authenticate: Bearer`) for a request without `Authorization: Bearer KEY` of one of the
    server's keys (`known(key)`: Service.key_limits), on every path but `open_paths` (`is_open`; an API that takes
    its key elsewhere, as LibreTranslate's `api_key` field, checks it itself); no body is read first."""

    def __init__(self, app, known: Callable[[bytes], bool], open_paths: set[str]):
        self.app, self.known, self.open_paths = app, known, open_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = routed_path(scope)
        key = bearer_key(scope)
        if is_open(path, self.open_paths) or (key is not None and self.known(key)):
            return await self.app(scope, receive, send)
        from twostep.serving.service import error

        response = error(401, "unauthorized: send the header Authorization: Bearer KEY, with a key of this server",
                         **{"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)
