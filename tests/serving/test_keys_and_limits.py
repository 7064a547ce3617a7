"""Keys and limits as a LibreTranslate deployment has them: `twostep keys add|remove|list` on a real SQLite file,
and `twostep serve --api-key-db --req-limit --char-limit --batch-limit --alternatives-limit` answering in
LibreTranslate's statuses and words (its app.py): 403 for an unknown key, 429 "Slowdown: N per 1 minute" for a
client over its requests a minute, 400 "Invalid request: request (N) exceeds text limit (M)" for too many
characters or texts; a key's own limits in place of the server's."""

from __future__ import annotations

import hashlib

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")
pytest.importorskip("limits", reason="serving needs its extra (pip install -e '.[serve]')")

from cli_helpers import assert_user_error, twostep  # noqa: E402
from serving_helpers import post, refused_start, server  # noqa: E402

pytestmark = pytest.mark.slow

FILE_KEY, COUNTED = "file-k3y-61c2", "counted-k3y-07b4"  # a key file's: the server's limits
SLOW, WIDE, NARROW = "slow-k3y-9a0e", "wide-k3y-3f17", "narrow-k3y-d25b"  # a database's: their own


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def added(db, *args) -> str:
    result = twostep("keys", "add", "--api-key-db", db, *map(str, args))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_keys_are_added_listed_and_removed_and_the_database_holds_no_key(tmp_path):
    db = tmp_path / "keys.db"
    new = added(db, 30)  # a new random key, as LibreTranslate's: a UUID
    assert len(new) == 36 and new.count("-") == 4
    assert added(db, 5, "--key", NARROW, "--char-limit", 40) == NARROW
    assert added(db, 7, "--key", NARROW, "--char-limit", 40) == NARROW  # its limits replaced, not a second key
    listed = twostep("keys", "list", "--api-key-db", db)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [f"{digest(new)}: 30 requests per minute, the server's characters per "
                                          "request", f"{digest(NARROW)}: 7 requests per minute, 40 characters per "
                                          "request"]
    data = db.read_bytes()
    assert new.encode() not in data and NARROW.encode() not in data and bytes.fromhex(digest(NARROW)) in data
    for key in (NARROW, digest(new)):  # by the key, or by its digest as list shows it
        result = twostep("keys", "remove", "--api-key-db", db, key)
        assert result.returncode == 0, result.stderr
    assert twostep("keys", "list", "--api-key-db", db).stdout.strip() == "There are no API keys"
    assert_user_error(twostep("keys", "remove", "--api-key-db", db, NARROW), f"no such key in {db}")


@pytest.mark.parametrize("case", ["absent", "not a database", "another table"])
def test_a_missing_or_bad_database_is_one_line(tmp_path, case):
    import sqlite3

    db = tmp_path / "keys.db"
    if case == "not a database":
        db.write_bytes(b"not a database, but long enough to look like one's header" * 4)
    elif case == "another table":  # LibreTranslate's own, which keeps keys in plain text
        with sqlite3.connect(db) as c:
            c.execute('CREATE TABLE api_keys ("api_key" TEXT NOT NULL, "req_limit" INTEGER NOT NULL)')
    message = {"absent": "no keys database at", "not a database": "file is not a database",
               "another table": "no such column: digest"}[case]
    for command in (["list"], ["remove", NARROW], *([["add", "5"]] if case != "absent" else [])):
        assert_user_error(twostep("keys", *command, "--api-key-db", db), message)
    if case == "not a database":
        assert_user_error(refused_start(tmp_path, "--api-key-db", db), message)


@pytest.fixture(scope="module")
def keyed_server(demo_artifact, tmp_path_factory):
    """A server with a key file's key (the server's limits) and a database's: SLOW at 2 requests a minute,
    WIDE with more characters than the server's, NARROW with fewer."""
    folder = tmp_path_factory.mktemp("keyed")
    db, key_file = folder / "keys.db", folder / "keys.txt"
    key_file.write_text(f"{FILE_KEY}\n{COUNTED}\n")
    added(db, 2, "--key", SLOW)
    added(db, 50, "--key", WIDE, "--char-limit", 60)
    added(db, 50, "--key", NARROW, "--char-limit", 8)
    with server(demo_artifact, "--api-key-file", key_file, "--api-key-db", db, "--req-limit", 6, "--char-limit", 30,
                "--batch-limit", 3, "--alternatives-limit", 1) as (url, proc):
        yield url, db, proc


def lt(url: str, key: str | None, **body) -> httpx.Response:
    return httpx.post(f"{url}/translate", json={"source": "en", "target": "de", "q": "six", **body,
                                                **({"api_key": key} if key else {})}, timeout=60)


def refused(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"}, r.text
    return r.json()["error"]


def test_an_unknown_or_removed_key_is_403_and_a_known_one_is_served(keyed_server):
    url, _, _ = keyed_server
    assert refused(lt(url, "n0t-a-key"), 403) == "Invalid API key"
    assert refused(lt(url, SLOW[:-1]), 403) == "Invalid API key"
    assert lt(url, FILE_KEY).status_code == 200
    # a key added to and removed from the database while the server runs counts from its next request
    late = added(keyed_server[1], 5)
    assert lt(url, late).status_code == 200
    assert post(url, {"text": ["six"]}, headers={"Authorization": f"Bearer {late}"}).status_code == 200  # /v1 too
    assert twostep("keys", "remove", "--api-key-db", keyed_server[1], late).returncode == 0
    assert refused(lt(url, late), 403) == "Invalid API key"
    assert post(url, {"text": ["six"]}, headers={"Authorization": f"Bearer {late}"}).status_code == 401
    assert late not in "".join(keyed_server[2].log)


def test_a_key_over_its_requests_a_minute_is_429_while_another_key_passes(keyed_server):
    url, _, _ = keyed_server
    assert lt(url, SLOW).status_code == 200
    assert lt(url, SLOW).status_code == 200
    r = lt(url, SLOW)
    assert refused(r, 429) == "Slowdown: 2 per 1 minute"  # flask-limiter's words after LibreTranslate's
    assert 1 <= int(r.headers["retry-after"]) <= 60
    r = post(url, {"text": ["six"]}, headers={"Authorization": f"Bearer {SLOW}"})  # one count for both APIs
    assert r.status_code == 429 and "2 per 1 minute" in r.json()["error"]
    assert lt(url, WIDE).status_code == 200  # another key's own count


def test_a_list_counts_its_texts_against_the_servers_requests_a_minute(keyed_server):
    """COUNTED, a key file's, has the server's limit, 6 a minute; a list of N texts counts N, as LibreTranslate
    counts it."""
    url, _, _ = keyed_server
    assert lt(url, COUNTED, q=["six", "seven", "eight"]).status_code == 200
    assert lt(url, COUNTED, q=["six", "seven"]).status_code == 200
    assert lt(url, COUNTED).status_code == 200
    assert refused(lt(url, COUNTED), 429) == "Slowdown: 6 per 1 minute"


@pytest.mark.parametrize("key, size, status", [
    (WIDE, 31, 200),  # its own limit above the server's
    (WIDE, 61, 400),
    (NARROW, 9, 400),  # its own limit below the server's
    (NARROW, 8, 200),
])
def test_a_keys_own_characters_a_request_replace_the_servers(keyed_server, key, size, status):
    url, _, _ = keyed_server
    text = ("six " * 20)[:size - 1] + "."
    r = lt(url, key, q=text)
    assert r.status_code == status, r.text
    if status == 400:
        limit = {WIDE: 60, NARROW: 8}[key]
        assert r.json() == {"error": f"Invalid request: request ({size}) exceeds text limit ({limit})"}


def test_the_servers_character_and_texts_limits_in_libretranslates_words(keyed_server):
    url, _, _ = keyed_server
    key = WIDE  # 50 requests a minute: room for every request here
    text = "six seven eight nine ten eleven"  # 31 characters
    r = httpx.post(f"{url}/translate", json={"q": text, "source": "en", "target": "de", "api_key": FILE_KEY},
                   timeout=60)
    assert refused(r, 400) == "Invalid request: request (31) exceeds text limit (30)"
    r = post(url, {"text": [text]}, headers={"Authorization": f"Bearer {FILE_KEY}"})
    assert refused(r, 413) == "31 characters in one request; at most 30"
    assert refused(lt(url, key, q=["six"] * 4), 400) == "Invalid request: request (4) exceeds text limit (3)"
    assert lt(url, key, q=["six"] * 3).status_code == 200
    r = post(url, {"text": ["six"] * 4}, headers={"Authorization": f"Bearer {key}"})
    assert refused(r, 413) == "4 texts in one request; at most 3"


def test_the_servers_alternatives_limit_in_libretranslates_words(keyed_server):
    url, _, _ = keyed_server
    key = WIDE
    assert refused(lt(url, key, alternatives=2), 400) == "Invalid request: alternatives parameter must be <= 1"
    r = lt(url, key, alternatives=1)
    assert r.status_code == 200 and len(r.json()["alternatives"]) <= 1, r.text


def test_frontend_settings_say_the_character_limit_and_that_keys_are_needed(keyed_server):
    url, _, _ = keyed_server
    settings = httpx.get(f"{url}/frontend/settings").json()
    assert (settings["charLimit"], settings["apiKeys"], settings["keyRequired"]) == (30, True, True)


def test_an_open_server_counts_each_address(demo_artifact):
    """Without keys, --req-limit counts each client by its address (the app in-process: one test client)."""
    from fastapi.testclient import TestClient

    from twostep.serving.http import ServeConfig, build_app

    config = ServeConfig((str(demo_artifact),), req_limit=2)
    with TestClient(build_app(config)) as client:
        body = {"q": "six", "source": "en", "target": "de"}
        assert client.post("/translate", json=body).status_code == 200
        assert client.post("/v1/translate", json={"text": ["six"]}).status_code == 200
        r = client.post("/translate", json=body)
        assert (r.status_code, r.json()) == (429, {"error": "Slowdown: 2 per 1 minute"})
        settings = client.get("/frontend/settings").json()
        assert (settings["charLimit"], settings["apiKeys"], settings["keyRequired"]) == (20_000, False, False)
