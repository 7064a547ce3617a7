"""API keys, each with limits of its own, in a SQLite database: what LibreTranslate's `ltmanage keys` manages
(its libretranslate/api_keys.py), managed by `twostep keys add|remove|list` and read by `twostep serve
--api-key-db`. A key's requests a minute and characters a request replace the server's (--req-limit, --max-chars)
for that key, as LibreTranslate's get_req_limits and get_char_limit do.

The database holds each key's SHA-256 digest (`key_digest`, the same digest as a key file's), never the key: a
copy of the database lets no one in. `twostep keys add` prints the key once; `list` shows the digests."""

from __future__ import annotations

import hashlib
import hmac
import sqlite3
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from twostep.errors import TwostepError

SCHEMA = """CREATE TABLE IF NOT EXISTS api_keys (
    digest BLOB PRIMARY KEY,  -- SHA-256 of the key
    req_limit INTEGER NOT NULL,  -- requests a minute
    char_limit INTEGER  -- characters a request; NULL: the server's
)"""


def key_digest(key: bytes) -> bytes:
    """What the server keeps of a key: its SHA-256 digest (the key stripped of spaces around it)."""
    return hashlib.sha256(key.strip()).digest()


def known_key(digests: tuple[bytes, ...], key: bytes) -> bool:
    """Whether `key` is one of the server's keys (given as SHA-256 digests). The digest of the key sent is
    compared with every key's, each in constant time and with no early exit: the time taken tells neither
    whether nor which key matched."""
    digest = key_digest(key)
    matches = [hmac.compare_digest(digest, known) for known in digests]  # all of them, always
    return any(matches)


@dataclass(frozen=True)
class KeyLimits:
    """A key's own limits; None: the server's (--req-limit, --max-chars), as a key file's keys have."""

    req_limit: Optional[int] = None  # requests a minute
    char_limit: Optional[int] = None  # characters a request, all its texts together


@contextmanager
def checked(path: Path):
    """A SQLite error as one TwostepError that names the file (a file that is no database, another program's
    database, a locked one)."""
    try:
        yield
    except sqlite3.Error as exc:
        raise TwostepError(f"keys database {path}: {exc}; give a database that twostep keys add made") from None


class KeyDatabase:
    """The keys database at `path`, opened in SQLite's `mode`: ro (read-only, as the server opens it), rw, or rwc
    (made, with its table, if it is not there). A missing file (but for rwc) and every SQLite error is a
    TwostepError that names the file."""

    def __init__(self, path: Path | str, mode: str = "ro"):
        self.path = Path(path)
        if mode != "rwc" and not self.path.is_file():
            raise TwostepError(f"no keys database at {self.path}: make one with twostep keys add --api-key-db "
                               f"{self.path} REQ_LIMIT")
        with checked(self.path):
            self.db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode={mode}", uri=True,
                                      check_same_thread=False)
            if mode == "rwc":
                self.db.execute(SCHEMA)
            self.db.execute("SELECT digest, req_limit, char_limit FROM api_keys LIMIT 0")  # twostep's table

    def lookup(self, key: bytes) -> KeyLimits | None:
        """`key`'s limits, or None if it is not in the database. A lookup by digest: the time it takes tells
        nothing of the keys (the digest of a key one tries is no prefix of a key's)."""
        with checked(self.path):
            row = self.db.execute("SELECT req_limit, char_limit FROM api_keys WHERE digest = ?",
                                  (key_digest(key),)).fetchone()
        return KeyLimits(*row) if row else None

    def add(self, req_limit: int, key: str | None = None, char_limit: int | None = None) -> str:
        """Add `key` (None: a new random one, a UUID as LibreTranslate makes) with its limits, replacing the
        limits it had; the key."""
        key = str(uuid.uuid4()) if key is None else key.strip()
        if not key:
            raise TwostepError("a key must hold more than spaces; leave --key out for a new random key")
        with checked(self.path), self.db:
            self.db.execute("INSERT OR REPLACE INTO api_keys (digest, req_limit, char_limit) VALUES (?, ?, ?)",
                            (key_digest(key.encode()), req_limit, char_limit))
        return key

    def remove(self, key: str) -> bool:
        """Remove `key`, given as the key or as its digest in hex (as `all` lists it); whether it was there."""
        digests = [key_digest(key.encode())]
        try:
            digests.append(bytes.fromhex(key.strip()))
        except ValueError:
            pass
        with checked(self.path), self.db:
            removed = self.db.execute(f"DELETE FROM api_keys WHERE digest IN ({', '.join('?' * len(digests))})",
                                      digests).rowcount
        return removed > 0

    def all(self) -> list[tuple[str, KeyLimits]]:
        """Every key's digest (hex) and limits."""
        with checked(self.path):
            rows = self.db.execute("SELECT digest, req_limit, char_limit FROM api_keys ORDER BY rowid").fetchall()
        return [(digest.hex(), KeyLimits(req_limit, char_limit)) for digest, req_limit, char_limit in rows]

    def close(self) -> None:
        self.db.close()
