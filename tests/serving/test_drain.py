"""`twostep serve --shutdown-delay`: on SIGTERM /readyz answers 503 while requests are still answered, then the
listener closes, requests in flight finish and the process exits 0. A real server, driven over HTTP."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")

from cli_helpers import assert_user_error  # noqa: E402
from serving_helpers import refused_start, server  # noqa: E402

pytestmark = pytest.mark.slow

DELAY = 4.0


@pytest.fixture(scope="module")
def heavy():
    """Requests that decode one sentence at a time with --max-batch-rows 4 (beam 4, without eos), so that they
    last `sentences` x `tokens` steps: `heavy(tokens, sentences=8)`."""
    from twostep.model.tasks import get_task

    longest = sorted((source for source, _ in get_task("numbers-en-de").split("test")), key=len)[-8:]
    return lambda tokens, sentences=8: {"text": [longest[i % 8] for i in range(sentences)], "beam": 4,
                                        "suppress_eos": True, "max_new_tokens": tokens}


def attempt(method, url, **kw):
    """(status, headers) of a request on a fresh connection, or "refused" when nothing listens; other errors
    (a connection reset, say) raise."""
    try:
        r = httpx.request(method, url, timeout=120, **kw)
    except httpx.ConnectError:
        return "refused", None
    return r.status_code, r.headers


def refused_at(url, deadline: float) -> float:
    """When /healthz was first refused (polled on fresh connections until `deadline`). A probe that connects as
    the listener closes may be reset instead: that one is not counted."""
    while time.monotonic() < deadline:
        try:
            status, _ = attempt("GET", f"{url}/healthz")
        except httpx.TransportError:
            continue
        if status == "refused":
            return time.monotonic()
        assert status == 200
        time.sleep(0.05)
    pytest.fail("the listener did not close")


def test_drain_answers_requests_through_the_delay_then_closes_and_finishes_those_in_flight(demo_artifact, heavy):
    with server(demo_artifact, "--shutdown-delay", DELAY, "--max-batch-rows", 4) as (url, proc):
        assert httpx.get(f"{url}/readyz").status_code == 200

        def translate(tokens, sentences=8):  # (status, Connection header)
            status, headers = attempt("POST", f"{url}/v1/translate", json=heavy(tokens, sentences))
            return status, headers and headers.get("connection")

        started = time.monotonic()
        assert translate(40)[0] == 200  # 320 steps: this machine's step time sizes the last request
        step_s = (time.monotonic() - started) / 320
        late_sentences = min(64, max(8, round(8.0 / (step_s * 100))))  # ~8 s of steps; 64: the sentence cap
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        def client():  # requests one after another, all sent within the delay
            sent = []
            while time.monotonic() < signalled + DELAY - 1:
                sent.append(translate(40))
            return sent

        with ThreadPoolExecutor(4) as pool:
            clients = [pool.submit(client) for _ in range(3)]
            ready = []
            while time.monotonic() < signalled + DELAY - 1:
                ready.append(attempt("GET", f"{url}/readyz")[0])
                assert attempt("GET", f"{url}/healthz")[0] == 200  # alive: nothing for a liveness probe to kill
                time.sleep(0.1)
            time.sleep(max(0.0, signalled + DELAY - 0.5 - time.monotonic()))
            late = pool.submit(translate, 100, late_sentences)  # behind the steps of the other requests
            time.sleep(0.7)  # past the delay, and past uvicorn's 0.1 s tick
            closed = refused_at(url, signalled + DELAY + 20)
            late_in_flight = not late.done()
            requests = [r for c in clients for r in c.result()] + [late.result()]
        code = proc.wait(60)
    assert ready[0] == 503 and set(ready) == {503}, ready  # from the first look on, while requests are answered
    assert len(ready) >= 2
    assert closed - signalled >= DELAY
    assert [status for status, _ in requests] == [200] * len(requests)
    assert all(connection == "close" for _, connection in requests)  # keep-alive clients reconnect elsewhere
    assert late_in_flight, "the last request finished before the listener closed: make it heavier"
    assert code == 0
    draining = [line for line in proc.log if "draining" in line]
    assert len(draining) == 1, "".join(proc.log)
    assert proc.log.index(draining[0]) < next(i for i, line in enumerate(proc.log) if "Shutting down" in line)


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_second_sigterm_or_ctrl_c_skips_the_delay(demo_artifact, second):
    with server(demo_artifact, "--shutdown-delay", 60) as (url, proc):
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert httpx.get(f"{url}/readyz").status_code == 503
        assert httpx.post(f"{url}/v1/translate", json={"text": ["seven"]}).status_code == 200
        proc.send_signal(second)
        code = proc.wait(30)
    assert time.monotonic() - signalled < 30  # well before the 60 s delay
    assert code == 0


def test_without_a_delay_sigterm_closes_the_listener_at_once_and_finishes_requests_in_flight(demo_artifact, heavy):
    with server(demo_artifact, "--max-batch-rows", 4) as (url, proc):
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(attempt, "POST", f"{url}/v1/translate", json=heavy(100))
            deadline = time.monotonic() + 30
            while "batches_total 0" in httpx.get(f"{url}/metrics").text and time.monotonic() < deadline:
                time.sleep(0.02)  # until the request decodes
            proc.send_signal(signal.SIGTERM)
            refused_at(url, time.monotonic() + 5)
            assert not pending.done(), "the request finished before the listener closed (at once, or `heavy` too light)"
            assert pending.result()[0] == 200
        code = proc.wait(60)
    assert code == 0
    assert not any("draining" in line for line in proc.log)


def test_ray_refuses_the_shutdown_delay_and_names_its_own_options(demo_artifact):
    """Ray Serve's proxy, not uvicorn, takes the requests with --ray: no delay to honour there."""
    assert_user_error(refused_start(demo_artifact, "--ray", "--shutdown-delay", 5), "--shutdown-delay",
                      "--graceful-shutdown-timeout")
