"""LibreTranslate's POST /suggest (`twostep serve --suggestions`): suggestions land in SQLite in LibreTranslate's
table, refusals in its words, and `twostep suggestions export` turns a database (ours or LibreTranslate's) into a
parallel corpus. The app runs in this process without its models (/suggest needs none)."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")

from cli_helpers import assert_user_error, twostep  # noqa: E402
from twostep.serving.http import ServeConfig, build_app  # noqa: E402

# LibreTranslate 1.9.6's libretranslate/suggestions.py, as it creates its db/suggestions.db
LT_TABLE = """CREATE TABLE IF NOT EXISTS suggestions (
            "q"	TEXT NOT NULL,
            "s"	TEXT NOT NULL,
            "source"	TEXT NOT NULL,
            "target"	TEXT NOT NULL
        );"""


def ask(config: ServeConfig, *requests: tuple[str, dict]) -> list[httpx.Response]:
    async def run():
        transport = httpx.ASGITransport(app=build_app(config))
        async with httpx.AsyncClient(transport=transport, base_url="http://twostep") as client:
            return [await client.post("/suggest", **kwargs) for kwargs in requests]

    return asyncio.run(run())


def rows(db) -> list[tuple]:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT q, s, source, target FROM suggestions ORDER BY rowid").fetchall()


def test_suggestions_are_stored_as_libretranslate_stores_them(tmp_path):
    db = tmp_path / "db" / "suggestions.db"
    answers = ask(ServeConfig(("no-such-model",), suggestions=str(db)),
                  {"json": {"q": "Hello world!", "s": "¡Hola mundo!", "source": "en", "target": "es"}},
                  {"data": {"q": "Good day", "s": "Bonjour", "source": "EN", "target": "fr"}})  # a form
    assert [(r.status_code, r.json()) for r in answers] == [(200, {"success": True})] * 2
    assert rows(db) == [("Hello world!", "¡Hola mundo!", "en", "es"), ("Good day", "Bonjour", "en", "fr")]


@pytest.mark.parametrize("body, message", [
    ({"s": "b", "source": "en", "target": "fr"}, "Invalid request: missing q parameter"),
    ({"q": "a", "source": "en", "target": "fr"}, "Invalid request: missing s parameter"),
    ({"q": "a", "s": "b", "target": "fr"}, "Invalid request: missing source parameter"),
    ({"q": "a", "s": "b", "source": "en"}, "Invalid request: missing target parameter"),
    ({"q": "a", "s": "b", "source": "../../x", "target": "fr"}, "Invalid request: ../../x is not a language code"),
    ({"q": "a" * 30, "s": "b", "source": "en", "target": "fr"},
     "Invalid request: request (31) exceeds text limit (20)"),
])
def test_a_bad_suggestion_is_refused_and_not_stored(tmp_path, body, message):
    db = tmp_path / "s.db"
    [answer] = ask(ServeConfig(("no-such-model",), suggestions=str(db), max_chars=20), {"json": body})
    assert (answer.status_code, answer.json()) == (400, {"error": message})
    assert rows(db) == []


def test_suggestions_are_off_unless_asked_for():
    [answer] = ask(ServeConfig(("no-such-model",)), {"json": {"q": "a", "s": "b", "source": "en", "target": "fr"}})
    assert (answer.status_code, answer.json()) == (403, {"error": "Suggestions are disabled on this server."})


def test_a_libretranslate_database_exports_as_a_parallel_corpus(tmp_path):
    db = tmp_path / "suggestions.db"
    with sqlite3.connect(db) as c:
        c.execute(LT_TABLE)
        c.executemany("INSERT INTO suggestions (q, s, source, target) VALUES (?, ?, ?, ?)", [
            ("Hello\nworld", "Bonjour\tle  monde", "en", "fr"), ("Thanks", "Merci", "en", "fr"),
            ("Danke", "Thanks", "de", "en"), ("teh cat", "the cat", "en", "en"), ("x", "y", "../en", "fr")])
    result = twostep("suggestions", "export", db, "--out", tmp_path / "corpus")
    assert result.returncode == 0, result.stderr
    assert "en-fr: 2 sentence pairs" in result.stdout and "skipped 1 suggestion(s)" in result.stdout
    corpus = {p.name: p.read_text(encoding="utf-8") for p in (tmp_path / "corpus").iterdir()}
    assert corpus == {"en-fr.en": "Hello world\nThanks\n", "en-fr.fr": "Bonjour le monde\nMerci\n",
                      "de-en.de": "Danke\n", "de-en.en": "Thanks\n",
                      "en-en.en": "teh cat\n", "en-en.suggested.en": "the cat\n"}
    again = twostep("suggestions", "export", db, "--out", tmp_path / "corpus")
    assert_user_error(again, "already exist")
    assert {p.name: p.read_text(encoding="utf-8") for p in (tmp_path / "corpus").iterdir()} == corpus


def test_a_database_without_suggestions_is_one_line_and_left_as_it_was(tmp_path):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE notes (text TEXT)")
    before = other.read_bytes()
    assert_user_error(twostep("suggestions", "export", other, "--out", tmp_path / "out"), "no such table")
    assert other.read_bytes() == before and not (tmp_path / "out").exists()


def test_a_file_that_is_not_a_database_is_one_line(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite at all" * 100)
    assert_user_error(twostep("suggestions", "export", junk, "--out", tmp_path / "out"), "junk.db")
    assert not (tmp_path / "out").exists()
