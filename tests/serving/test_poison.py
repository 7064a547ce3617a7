"""One request never fails another, over HTTP: a poison request sent at the same moment as eight good ones, three
rounds, on twostep's API and LibreTranslate's, against a real `twostep serve` process. The good requests answer what
they answer alone and none is left waiting; the poison gets one JSON error. Poisons: each decoding option beyond
either end of its range (refused before it is queued) and at each end (answered), and a fault injected into the
server's decoding (tests/fault_helpers.py: a search group, or the model's session, that raises on one source
token), which reaches the running batch the good requests share."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from fault_helpers import POISON_SITE, poison_word
from serving_helpers import server
from twostep.artifact import load_artifact
from twostep.runtime.decoding.options import BOUNDS

pytestmark = pytest.mark.slow
ROUNDS = 3
MAX_BEAM = 8


@pytest.fixture(scope="module")
def good() -> list[str]:
    from twostep.model.tasks import get_task

    return [source for source, _ in get_task("numbers-en-de").split("test")][:8]


@pytest.fixture(scope="module")
def poison(demo_artifact, good) -> tuple[str, int]:
    """A word of one source token that no good request has: (the word, its token)."""
    return poison_word(demo_artifact, good)


@pytest.fixture(scope="module", params=["search", "session"])
def poisoned_server(request, demo_artifact, poison):
    """`twostep serve` of the demo artifact whose decoding raises where a source holds the poison's token: in its
    search groups, or in its step session."""
    env = {"PYTHONPATH": POISON_SITE, "TWOSTEP_TEST_POISON": str(poison[1]), "TWOSTEP_TEST_POISON_IN": request.param}
    with server(demo_artifact, "--max-wait-ms", 50, "--max-beam", MAX_BEAM, env=env) as (url, proc):
        yield url, proc, request.param


def v1(text: str, **options) -> tuple[str, dict]:
    return "/v1/translate", {"text": [text], **options}


def lt(text: str, **fields) -> tuple[str, dict]:
    return "/translate", {"q": text, "source": "en", "target": "de", **fields}


async def send(url: str, requests: list[tuple[str, dict]]) -> list[httpx.Response]:
    """The requests at the same moment, each on a connection of its own."""
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=64)) as client:
        return await asyncio.gather(*(client.post(path, json=body) for path, body in requests))


def rounds(url: str, goods: list[tuple[str, dict]], poisons: list[tuple[str, dict]]) -> list[list[httpx.Response]]:
    """ROUNDS rounds of the good requests and the poisons, all at once, the poisons among the good ones; each
    round's responses in the order of goods + poisons."""
    out = []
    for _ in range(ROUNDS):
        half = len(goods) // 2
        answers = asyncio.run(send(url, goods[:half] + poisons + goods[half:]))
        out.append(answers[:half] + answers[half + len(poisons):] + answers[half:half + len(poisons)])
    return out


def answer(response: httpx.Response):
    """A response's JSON, its scores rounded (a row's logits differ in their last bits with the batch's shape)."""
    def rounded(value):
        if isinstance(value, dict):
            return {k: round(v, 4) if k == "score" else rounded(v) for k, v in value.items()}
        return [rounded(v) for v in value] if isinstance(value, list) else value
    return rounded(response.json())


def alone(url: str, goods: list[tuple[str, dict]]) -> list:
    answers = [asyncio.run(send(url, [request]))[0] for request in goods]
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    return [answer(a) for a in answers]


def fault_count(url: str, where: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f'twostep_decode_faults_total{{where="{where}"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"no twostep_decode_faults_total for {where} in /metrics")


@pytest.mark.parametrize("api", ["v1", "libretranslate"])
def test_a_request_whose_decode_raises_fails_alone_with_one_json_error(poisoned_server, good, poison, api):
    url, proc, where = poisoned_server
    ask = v1 if api == "v1" else lt
    options = {"beam": 2} if api == "v1" else {}  # beam search and greedy (LibreTranslate's default here)
    goods = [ask(text, **options) for text in good]
    want = alone(url, goods)
    before = fault_count(url, where)
    for answers in rounds(url, goods, [ask(f"{good[0]} {poison[0]}", **options)]):
        assert [answer(a) for a in answers[:-1]] == want
        bad = answers[-1]
        assert bad.status_code == 500 and bad.headers["content-type"] == "application/json", bad.text
        assert set(bad.json()) == {"error"} and "decoding this request failed" in bad.json()["error"]
    assert fault_count(url, where) > before
    assert proc.poll() is None  # the server goes on


def test_a_stream_whose_decode_raises_ends_with_an_error_event_and_the_others_stream_as_alone(poisoned_server, good,
                                                                                              poison):
    url, _, _ = poisoned_server

    async def streams(texts: list[str]) -> list[list[tuple[str, dict]]]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            async def one(text):
                async with client.stream("POST", "/v1/translate", json={"text": [text], "stream": True}) as r:
                    events, name = [], None
                    async for line in r.aiter_lines():
                        if line.startswith("event:"):
                            name = line.split(":", 1)[1].strip()
                        elif line.startswith("data:"):
                            events.append((name, json.loads(line.split(":", 1)[1])))
                    return events
            return await asyncio.gather(*(one(t) for t in texts))

    want = [asyncio.run(streams([text]))[0] for text in good]
    for _ in range(ROUNDS):
        *got, bad = asyncio.run(streams([*good, f"{good[0]} {poison[0]}"]))
        assert [[e for e in events if e[0] != "delta"] for events in got] == \
               [[e for e in events if e[0] != "delta"] for events in want]
        assert bad[-1][0] == "error" and "decoding this request failed" in bad[-1][1]["error"], bad


def extremes(max_positions: int) -> tuple[list[dict], list[dict]]:
    """Each decoding option of twostep's API at the ends of its range as this server has it (answered), and just
    beyond them (refused): BOUNDS, with the server's beam limit (--max-beam) and the model's positions."""
    answered, refused = [], []
    ends = {"beam": (1, MAX_BEAM), "n_best": (1, MAX_BEAM), "max_new_tokens": (1, max_positions)}
    names = {"beam": "beam_size"}
    for field in ("beam", "n_best", "length_penalty", "temperature", "top_k", "top_p", "seed", "max_new_tokens",
                  "min_new_tokens", "no_repeat_ngram_size"):
        bound = BOUNDS[names.get(field, field)]
        low, high = ends.get(field, (bound.low, bound.high))
        base = {"beam": MAX_BEAM} if field in ("n_best", "length_penalty") else \
            {"sampling": True} if field in ("temperature", "top_k", "top_p", "seed") else {}
        step = 1 if bound.integer else 1e-3
        answered += [{**base, field: high}] + ([{**base, field: low}] if not bound.low_open else [])
        refused += [{**base, field: high + step}, {**base, field: low - (0 if bound.low_open else step)}]
        refused += [{**base, field: "many"}]
    refused += [{"length_penalty": 700, "beam": 4}, {"length_penalty": -1e300, "beam": 4}, {"beam": 2 ** 70},
                {"sampling": True, "beam": 4}]
    return answered, refused


def test_options_at_and_beyond_their_ends_among_good_requests(poisoned_server, good, demo_artifact):
    url, proc, _ = poisoned_server
    goods = [v1(text) for text in good] + [lt(text) for text in good]
    answered, refused = extremes(load_artifact(demo_artifact).config.max_positions)
    lt_refused = [{"alternatives": MAX_BEAM}, {"alternatives": "many"}, {"format": "pdf"}]
    poisons = [v1(good[1], **o) for o in answered + refused] + [lt(good[1], **o) for o in lt_refused] + \
              [lt(good[1], alternatives=MAX_BEAM - 1), lt(good[1], alternatives=-1)]
    want = alone(url, goods)
    for answers in rounds(url, goods, poisons):
        assert [answer(a) for a in answers[:len(goods)]] == want
        out = answers[len(goods):]
        statuses = [a.status_code for a in out]
        assert statuses == [200] * len(answered) + [400] * (len(refused) + len(lt_refused)) + [200, 200], \
            [(p[1], a.status_code, a.text[:200]) for p, a in zip(poisons, out) if a.status_code not in (200, 400)]
        for a in out:
            assert a.headers["content-type"] == "application/json" and (a.status_code == 200 or
                                                                        set(a.json()) == {"error"}), a.text
    assert proc.poll() is None
