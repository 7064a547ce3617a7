"""Stored glossaries (issue 50), in DeepL's shape: `POST /v1/glossaries` stores one (a name, a language pair, its
entries as TSV or CSV: twostep.runtime.glossary.parse_entries), `/v1/translate` and LibreTranslate's `/translate`
use it by its `glossary_id`. Kept in SQLite (`twostep serve --glossaries PATH`; without it in memory, for the
process). Where the server has API keys, each glossary is its creator's (the key's SHA-256 digest, as
twostep.serving.keys keeps it): another key neither sees nor uses it. The entries are kept as JSON, one
[source, target, ...] list each."""

from __future__ import annotations

import json
import sqlite3
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from twostep.errors import BadInput, TwostepError
from twostep.runtime.glossary import Entry, Glossary

MAX_GLOSSARIES = 1000  # of one key (or of an open server)
MAX_NAME_CHARS = 256
SCHEMA = """CREATE TABLE IF NOT EXISTS glossaries (
    id TEXT PRIMARY KEY,
    owner BLOB NOT NULL,  -- SHA-256 of the key that created it; empty on a server without keys
    name TEXT NOT NULL,
    source_lang TEXT NOT NULL,
    target_lang TEXT NOT NULL,
    creation_time TEXT NOT NULL,  -- ISO 8601, UTC
    entries TEXT NOT NULL  -- JSON: [[source, target, further targets...], ...]
)"""


class UnknownGlossary(BadInput):
    """No such glossary, or another key's (404 from the glossary endpoints, 400 from a translation)."""

    def __init__(self, glossary_id: str):
        super().__init__(f"no glossary {glossary_id!r}: create one with POST /v1/glossaries, or list yours with GET "
                         "/v1/glossaries")


@dataclass(frozen=True)
class Stored:
    """A glossary's metadata, as DeepL's API gives it (`described`), and its entries."""

    id: str
    name: str
    source_lang: str
    target_lang: str
    creation_time: str
    entries: tuple[Entry, ...]

    def described(self) -> dict:
        return {"glossary_id": self.id, "name": self.name, "ready": True, "source_lang": self.source_lang,
                "target_lang": self.target_lang, "creation_time": self.creation_time,
                "entry_count": len(self.entries)}

    def tsv(self) -> str:
        return "".join("\t".join((e.source, *e.targets)) + "\n" for e in self.entries)

    def glossary(self) -> Glossary:
        return Glossary(self.entries)


class Glossaries:
    """The glossaries database at `path` (created with its folder if absent; None: in memory). One connection,
    shared by the server's threads under a lock; every write is committed before it returns."""

    def __init__(self, path: str | Path | None = None):
        self.path = path
        self.lock = threading.Lock()
        try:
            if path is None:
                self.db = sqlite3.connect(":memory:", check_same_thread=False)
            else:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                self.db = sqlite3.connect(path, check_same_thread=False)
            self.db.execute(SCHEMA)
            self.db.execute("SELECT id, owner, name, source_lang, target_lang, creation_time, entries FROM glossaries "
                            "LIMIT 0")
        except (OSError, sqlite3.Error) as exc:
            raise TwostepError(f"glossaries database {path}: {exc}; give a writable path for a new database, or "
                               "one that twostep serve --glossaries made") from None

    def create(self, owner: bytes, name: str, source_lang: str, target_lang: str, entries: list[Entry]) -> Stored:
        """Store a glossary of `entries` (checked as a Glossary checks them: none twice, at most MAX_ENTRIES)."""
        if not name.strip() or len(name) > MAX_NAME_CHARS:
            raise BadInput(f"a glossary's name holds something besides white space, at most {MAX_NAME_CHARS} "
                           "characters")
        if not entries:
            raise BadInput("the glossary has no entries: give one a line, a source term, a tab, then its target")
        for entry in entries:  # its entries are given back as TSV, one a line
            if any(c in term for term in (entry.source, *entry.targets) for c in "\t\r\n"):
                raise BadInput(f"the glossary term {entry.source!r} holds a tab or a line break")
        Glossary(entries)
        stored = Stored(str(uuid.uuid4()), name, source_lang, target_lang,
                        datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                        tuple(entries))
        with self.lock, self.db:
            (count,) = self.db.execute("SELECT count(*) FROM glossaries WHERE owner = ?", (owner,)).fetchone()
            if count >= MAX_GLOSSARIES:
                raise BadInput(f"{count} glossaries are stored for this key, at most {MAX_GLOSSARIES}: delete one "
                               "first (DELETE /v1/glossaries/ID)")
            self.db.execute("INSERT INTO glossaries VALUES (?, ?, ?, ?, ?, ?, ?)",
                            (stored.id, owner, name, source_lang, target_lang, stored.creation_time,
                             json.dumps([[e.source, *e.targets] for e in entries], ensure_ascii=False)))
        return stored

    def get(self, owner: bytes, glossary_id: str) -> Stored:
        """`owner`'s glossary; UnknownGlossary if there is none of that id, or it is another key's."""
        with self.lock:
            row = self.db.execute("SELECT id, name, source_lang, target_lang, creation_time, entries FROM glossaries "
                                  "WHERE id = ? AND owner = ?", (glossary_id, owner)).fetchone()
        if row is None:
            raise UnknownGlossary(glossary_id)
        return stored(row)

    def all(self, owner: bytes) -> list[Stored]:
        """`owner`'s glossaries, oldest first."""
        with self.lock:
            rows = self.db.execute("SELECT id, name, source_lang, target_lang, creation_time, entries FROM glossaries "
                                   "WHERE owner = ? ORDER BY rowid", (owner,)).fetchall()
        return [stored(row) for row in rows]

    def delete(self, owner: bytes, glossary_id: str) -> None:
        with self.lock, self.db:
            if not self.db.execute("DELETE FROM glossaries WHERE id = ? AND owner = ?", (glossary_id, owner)).rowcount:
                raise UnknownGlossary(glossary_id)

    def close(self) -> None:
        with self.lock:
            self.db.close()


def stored(row: tuple) -> Stored:
    glossary_id, name, source_lang, target_lang, creation_time, entries = row
    return Stored(glossary_id, name, source_lang, target_lang, creation_time,
                  tuple(Entry(source, tuple(targets)) for source, *targets in json.loads(entries)))


def inline(entries: list, ignore_case: bool = False) -> Glossary:
    """A request's own glossary: [{"source": str, "targets": [str, ...]}, ...] (checked by the API's schema)."""
    return Glossary([Entry(e["source"], tuple(e["targets"]), ignore_case) for e in entries])


def pair_of(route, source: str | None, target: str | None) -> tuple[str | None, str | None]:
    """A request's (or a glossary's) language pair, each side the standard tag its route names (a
    twostep.serving.models.Route), else the code as given, lower-cased (a model that names no languages on that
    side takes any code); None: no code (or auto) where the route names none."""
    def given(code):
        return code.strip().lower() if isinstance(code, str) and code.strip() and code != "auto" else None

    return route.source or given(source), route.target or given(target)


def check_pair(glossary_id: str, glossary: tuple[str | None, str | None], request: tuple[str | None, str | None]):
    """A stored glossary's pair against a request's (each side a standard tag, None where the model names no
    language there and nothing can be compared): BadInput where they differ."""
    if any(g is not None and r is not None and g != r for g, r in zip(glossary, request)):
        raise BadInput(f"glossary {glossary_id} is for {glossary[0]}->{glossary[1]}; this request translates "
                       f"{request[0]}->{request[1]}")
