"""LibreTranslate's own API tests, as its repository has them (libretranslate/tests/test_api in the libretranslate
1.9.6 wheel, which `make test` fetches and never installs), run against a real `twostep serve` of en -> es and
en -> fr: their `client` fixture is a client with Flask's test-client interface over HTTP. Each of its test
functions is one case here, under its own name."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")

from serving_helpers import server  # noqa: E402

pytestmark = pytest.mark.slow

WHEEL = Path(os.environ.get("TWOSTEP_LT_WHEEL", Path(__file__).resolve().parents[2] / ".venv" / "libretranslate" /
                            "libretranslate-1.9.6-py3-none-any.whl"))
SUITE = "libretranslate/tests/test_api/"


def libretranslate_tests() -> dict[str, object]:
    """Each test function of the wheel's tests/test_api (its conftest aside: it builds LibreTranslate's own app),
    by name."""
    found = {}
    with zipfile.ZipFile(WHEEL) as wheel:
        for name in sorted(wheel.namelist()):
            if name.startswith(SUITE) and Path(name).name.startswith("test_") and name.endswith(".py"):
                namespace: dict = {"__name__": Path(name).stem}
                exec(compile(wheel.read(name).decode(), name, "exec"), namespace)
                found.update({f"{Path(name).stem}::{key}": value for key, value in namespace.items()
                              if key.startswith("test_") and callable(value)})
    return found


TESTS = libretranslate_tests() if WHEEL.is_file() else {}


class Response:
    """What Flask's test client answers: status_code, data (bytes), json (parsed, or None)."""

    def __init__(self, r: httpx.Response):
        self.status_code, self.data = r.status_code, r.content
        try:
            self.json = r.json()
        except json.JSONDecodeError:
            self.json = None


class Client:
    """Flask's test client's get and post (data: form fields; json: a JSON body), over HTTP to `url`."""

    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **kwargs) -> Response:
        return Response(httpx.get(f"{self.url}{path}", timeout=60, **kwargs))

    def post(self, path: str, data=None, json=None, **kwargs) -> Response:
        return Response(httpx.post(f"{self.url}{path}", data=data, json=json, timeout=60, **kwargs))


@pytest.fixture(scope="module")
def client(argos_pairs):
    with server(argos_pairs["en", "es"], argos_pairs["en", "fr"]) as (url, _):
        yield Client(url)


def test_the_wheel_holds_libretranslates_suite():
    if not WHEEL.is_file():
        pytest.skip(f"LibreTranslate's wheel is not at {WHEEL}: `make test` fetches it (pip download --no-deps "
                    "libretranslate==1.9.6), or set TWOSTEP_LT_WHEEL")
    assert len(TESTS) >= 14 and any(name.endswith("::test_api_translate") for name in TESTS)


@pytest.mark.parametrize("name", sorted(TESTS))
def test_libretranslates_own(client, name):
    TESTS[name](client)
