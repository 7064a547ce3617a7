"""`twostep serve ART` on 127.0.0.1 and a free port, built and served as `serve` does (build_app, serve_app), with
a route, a middleware and a response body of its own that fail as no client may ever see: for
tests/serving/test_errors.py.

    python failing_server.py ART

GET /fail/route raises; GET /fail/middleware raises in a middleware inside twostep's (where its own run); GET
/fail/body raises once its response has started. Each exception's message holds SECRET, which no answer may show.
"""

from __future__ import annotations

import sys

from fastapi.responses import StreamingResponse
from starlette.middleware import Middleware

from twostep.serving.http import ServeConfig, build_app, serve_app

SECRET = "s3cr3t-detail"


class Failing:
    """A plain ASGI middleware that raises for /fail/middleware."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/fail/middleware":
            raise KeyError(SECRET)
        await self.app(scope, receive, send)


def main(art: str) -> None:
    app = build_app(ServeConfig((art,)))
    app.user_middleware.append(Middleware(Failing))  # the innermost of the middleware: inside twostep's

    @app.get("/fail/route")
    async def route():
        raise ZeroDivisionError(SECRET)

    @app.get("/fail/body")
    async def body():
        async def chunks():
            yield b"the first part, "
            raise ValueError(SECRET)

        return StreamingResponse(chunks(), media_type="text/plain")

    serve_app(app, "127.0.0.1", 0)


if __name__ == "__main__":
    main(sys.argv[1])
