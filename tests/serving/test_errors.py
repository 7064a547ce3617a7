"""Every error of `twostep serve` is JSON, {"error": ...}: Starlette's own refusals (no such path, a wrong method,
a malformed form), and an unexpected exception, a bug, whether a route, a middleware or a response body raises it:
a 500 whose traceback the log holds once, never Starlette's or uvicorn's plain text. A stream that fails ends
with an `error` event."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")

import twostep  # noqa: E402
from failing_server import SECRET  # noqa: E402
from serving_helpers import post, serving  # noqa: E402
from twostep.errors import BadInput  # noqa: E402
from twostep.runtime.documents import DocumentPlan  # noqa: E402
from twostep.runtime.streaming import Delta  # noqa: E402
from twostep.serving.api import v1  # noqa: E402
from twostep.serving.http import ServeConfig, build_app  # noqa: E402
from twostep.serving.service import Service  # noqa: E402

FAILING_SERVER = str(Path(__file__).parents[1] / "failing_server.py")
TRACEBACK = "Traceback (most recent call last)"


def app_client() -> httpx.AsyncClient:
    """A client of an app in this process, its models never opened (no lifespan): what answers before them."""
    app = build_app(ServeConfig(("no-such-model",)))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://twostep")


@pytest.mark.parametrize("method, path, kwargs, status, message", [
    ("GET", "/nowhere", {}, 404, "not found: GET /nowhere; this server's paths are listed at /openapi.json (and "
     "/docs)"),
    ("DELETE", "/translate", {}, 405, "method not allowed: DELETE /translate; the path takes POST"),
    ("POST", "/spec", {}, 405, "method not allowed: POST /spec; the path takes GET"),
    ("GET", "/v1/translate", {}, 405, "method not allowed: GET /v1/translate; the path takes POST"),
    ("POST", "/translate", {"content": b"garbage", "headers": {"content-type": "multipart/form-data; boundary=zz"}},
     400, "Invalid multipart data."),
])
def test_starlettes_refusals_are_json(method, path, kwargs, status, message):
    async def ask():
        async with app_client() as client:
            return await client.request(method, path, **kwargs)

    r = asyncio.run(ask())
    assert (r.status_code, r.headers["content-type"]) == (status, "application/json"), r.text
    assert r.json() == {"error": message}
    if status == 405:
        assert r.headers["allow"] == message.rsplit(" ", 1)[1]


@pytest.mark.slow
def test_an_unexpected_exception_is_a_json_500_and_one_traceback_in_the_log(demo_artifact):
    root = Path(twostep.__file__).resolve().parents[1]  # the child imports the twostep this test does
    with serving([sys.executable, FAILING_SERVER, str(demo_artifact)], env={"PYTHONPATH": str(root)}) as (url, proc):
        for kind, raised in (("route", "ZeroDivisionError"), ("middleware", "KeyError")):
            r = httpx.get(f"{url}/fail/{kind}", timeout=30)
            assert (r.status_code, r.headers["content-type"]) == (500, "application/json"), r.text
            assert r.json() == {"error": f"internal error: {raised} (a bug in the server; its log has the "
                                         "traceback)"}
        with pytest.raises(httpx.RemoteProtocolError):  # the body cut short: the connection closed, not a body ended
            httpx.get(f"{url}/fail/body", timeout=30)
        assert post(url, {"text": ["seven"]}).status_code == 200  # and the server goes on
    log = "".join(proc.log)
    assert log.count(TRACEBACK) == 3, log
    for path, raised in (("route", "ZeroDivisionError"), ("middleware", "KeyError"), ("body", "ValueError")):
        assert f"twostep.serving ERROR GET /fail/{path} failed: internal error: {raised}" in log, log
    assert "GET /fail/route 500" in log and "GET /fail/middleware 500" in log  # RequestLog's line, and count
    assert "Exception in ASGI application" not in log and "Internal Server Error" not in log  # uvicorn's, Starlette's


async def failing(then: Exception):
    yield Delta(0, "sie")
    raise then


def stream_events(then: Exception) -> list[tuple[str, dict]]:
    plan = DocumentPlan.sentences_of(["seven"])
    service = Service(ServeConfig(("no-such-model",)))

    async def read():
        return [(e["event"], json.loads(e["data"])) async for e in v1.events(failing(then), plan, service)]

    return asyncio.run(read())


def test_a_stream_that_fails_ends_with_an_error_event_and_one_traceback(caplog):
    with caplog.at_level(logging.INFO, logger="twostep.serving"):
        events = stream_events(RuntimeError(SECRET))
    assert events == [("delta", {"text": 0, "sentence": 0, "delta": "sie"}),
                      ("error", {"error": "internal error: RuntimeError (a bug in the server; its log has the "
                                          "traceback)"})]
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1 and logged[0].exc_info[0] is RuntimeError
    # a refusal while decoding (an engine profile's limit, say) is the client's to read, and no bug
    caplog.clear()
    assert stream_events(BadInput("decoding up to 200 target positions"))[-1] == \
        ("error", {"error": "decoding up to 200 target positions"})
    assert not [r for r in caplog.records if r.exc_info]
