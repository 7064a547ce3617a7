"""A client that goes away mid-request: `twostep serve` drops its rows from the running batch and logs it with 499
(twostep/serving/http.py until_disconnected, RequestLog; the engine's cancelled sentences)."""

from __future__ import annotations

import json
import re
import socket
import time
from urllib.parse import urlsplit

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from serving_helpers import post, server  # noqa: E402

pytestmark = pytest.mark.slow


def metrics(url: str) -> dict:
    """The server's Prometheus metric families now, by name."""
    return {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text)}


def decoder_steps(url: str) -> float:
    return next(s.value for s in metrics(url)["twostep_decoder_steps"].samples)


def until(condition, timeout_s: float, what: str, poll_s: float = 0.05):
    """Poll `condition()` until it returns something true (returned), for at most timeout_s seconds."""
    deadline = time.monotonic() + timeout_s
    while not (got := condition()):
        assert time.monotonic() < deadline, f"{what} not within {timeout_s} s"
        time.sleep(poll_s)
    return got


def leave_mid_request(url: str, body: dict, steps: int, wait_for_headers: bool = False) -> tuple[float, float]:
    """Send `body` on a raw connection and close it once the decoder has run 3 steps (after the response's
    status line, if `wait_for_headers`); (decoder steps then, decoder steps once nothing decodes any more)."""
    data = json.dumps(body).encode()
    address = urlsplit(url)
    with socket.create_connection((address.hostname, address.port), timeout=30) as client:
        client.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (address.netloc.encode(), len(data), data))
        if wait_for_headers:
            assert client.recv(64).startswith(b"HTTP/1.1 200")
        started = until(lambda: (now := decoder_steps(url)) >= 3 and now, 60, "the request's first steps")

    def settled():  # the same steps 2 s apart (many steps' time, on a busy machine too): nothing decodes
        first = decoder_steps(url)
        time.sleep(2)
        return first == decoder_steps(url) and first

    ran = until(settled, 30, "the decoder stopping")
    return started, ran


def test_a_client_that_disconnects_mid_request_or_mid_stream_has_its_rows_dropped(demo_artifact):
    """32 sentences x beam 8 that would decode 100 steps each (suppress_eos): once the decoder has stepped, the
    client closes its connection; the decoder stops within a few steps (its 256 rows left the batch), the
    request is logged and counted with 499, and the server goes on answering. The same for a stream the client
    leaves once it has begun: the stream is closed, its rows dropped."""
    from twostep.model.tasks import get_task

    sentences = [source for source, _ in get_task("numbers-en-de").split("test")][:32]
    steps = 100  # what the request would run
    body = {"text": sentences, "beam": 8, "suppress_eos": True, "max_new_tokens": steps, "split": False}
    with server(demo_artifact, "--threads", 1, "--max-batch-rows", 256, "--max-batch-tokens", 100_000) as (url, proc):
        started, ran = leave_mid_request(url, body, steps)
        assert ran - started <= 20 and ran < steps / 2, \
            f"the decoder ran {ran:.0f} steps of the request's {steps} ({started:.0f} when the client left)"
        until(lambda: any(re.search(r"POST /v1/translate 499 [\d.]+ ms", line) for line in proc.log), 10,
              "the request's log line with 499")
        by_status = {s.labels["status"]: s.value for s in metrics(url)["twostep_requests"].samples
                     if s.name == "twostep_requests_total"}
        assert by_status == {"499": 1.0}
        assert post(url, {"text": sentences[:1]}).status_code == 200

        before = decoder_steps(url)
        started, ran = leave_mid_request(url, {**body, "stream": True}, steps, wait_for_headers=True)
        assert ran - started <= 20 and ran - before < steps / 2, \
            f"the decoder ran {ran - before:.0f} steps of the stream's {steps} ({started - before:.0f} when it left)"
        assert post(url, {"text": sentences[:1]}).status_code == 200
