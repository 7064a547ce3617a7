"""Suggested translations (LibreTranslate's POST /suggest, on with `twostep serve --suggestions`): each a source
text, the translation a user suggests for it, and their two languages, kept in SQLite in LibreTranslate's table
(suggestions: q, s, source, target), so a LibreTranslate deployment's db/suggestions.db carries over either way.
`export` writes them as a parallel corpus: for each language pair, two line-aligned files named as OPUS and
sacrebleu name them (en-fr.en, en-fr.fr), each text on one line (its line breaks and tabs made spaces)."""

from __future__ import annotations

import re
import sqlite3
import threading
from pathlib import Path

from twostep.errors import TwostepError

CODE = re.compile(r"[a-z]{2,3}(-[a-z0-9]{2,8})*")  # lower-case tags (LibreTranslate's iso2model): safe in a name
TABLE = """CREATE TABLE IF NOT EXISTS suggestions (
    "q" TEXT NOT NULL, "s" TEXT NOT NULL, "source" TEXT NOT NULL, "target" TEXT NOT NULL)"""


class Suggestions:
    """The suggestions database at `path` (created with its folder if absent; `read_only`: opened as it is, never
    written). One connection, shared by the server's threads under a lock; every write is committed before it
    returns."""

    def __init__(self, path: str | Path, read_only: bool = False):
        self.path = Path(path)
        self.lock = threading.Lock()
        try:
            if read_only:
                self.db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.db = sqlite3.connect(self.path, check_same_thread=False)
                self.db.execute(TABLE)
            self.db.execute("SELECT q, s, source, target FROM suggestions LIMIT 1").fetchall()
        except (OSError, sqlite3.Error) as exc:
            raise TwostepError(f"suggestions database {path}: {exc}; give a writable path for a new database, "
                               "or LibreTranslate's db/suggestions.db") from None

    def add(self, q: str, s: str, source: str, target: str) -> None:
        with self.lock:
            self.db.execute("INSERT INTO suggestions (q, s, source, target) VALUES (?, ?, ?, ?)",
                            (q, s, source, target))
            self.db.commit()

    def pairs(self) -> dict[tuple[str, str], list[tuple[str, str]]]:
        """Every suggestion, by (source, target), in the order they came."""
        with self.lock:
            rows = self.db.execute("SELECT source, target, q, s FROM suggestions ORDER BY rowid").fetchall()
        out: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for source, target, q, s in rows:
            out.setdefault((source, target), []).append((q, s))
        return out

    def close(self) -> None:
        with self.lock:
            self.db.close()


def one_line(text: str) -> str:
    return " ".join(text.split())


def export(database: str | Path, out: Path) -> tuple[dict[tuple[str, str], int], int]:
    """The suggestions of `database` as a parallel corpus in `out` (created; files already there are refused, not
    overwritten): ({(source, target): sentence pairs written}, suggestions skipped: a language code that is not
    one, which a LibreTranslate database may hold, never makes a file name)."""
    if not Path(database).is_file():
        raise TwostepError(f"suggestions database {database}: no such file")
    suggestions = Suggestions(database, read_only=True)  # a user's file: read, never changed
    try:
        pairs = suggestions.pairs()
    finally:
        suggestions.close()
    named = {pair: rows for pair, rows in pairs.items() if all(CODE.fullmatch(code) for code in pair)}
    skipped = sum(len(rows) for pair, rows in pairs.items() if pair not in named)
    pairs = named
    files = {(source, target): (out / f"{source}-{target}.{source}",  # a pair of one language: a correction
                                out / f"{source}-{target}.{'suggested.' if source == target else ''}{target}")
             for source, target in pairs}
    taken = [str(f) for names in files.values() for f in names if f.exists()]
    if taken:
        raise TwostepError(f"{', '.join(taken)} already exist; export into a new folder")
    out.mkdir(parents=True, exist_ok=True)
    for pair, rows in pairs.items():
        sources, targets = files[pair]
        sources.write_text("".join(one_line(q) + "\n" for q, _ in rows), encoding="utf-8")
        targets.write_text("".join(one_line(s) + "\n" for _, s in rows), encoding="utf-8")
    return {pair: len(rows) for pair, rows in pairs.items()}, skipped
