"""The C++ embedding's paths and its example program, for the tests that build and run it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

CPP = Path(__file__).resolve().parents[1] / "cpp"


def translate_cpp(build: Path, art: Path, lines: list[str], *args) -> subprocess.CompletedProcess:
    """cpp/'s example program: one sentence a line in, one translation a line out."""
    return subprocess.run([str(build / "twostep-translate"), str(art), *map(str, args)], input="".join(
        line + "\n" for line in lines), capture_output=True, text=True, timeout=900)


def stream_cpp(build: Path, art: Path, lines: list[str], *args) -> list[dict]:
    """The example program with --stream: its events ({"sentence", "delta" or "tokens", "finished"}) in the
    order printed. Each line is decoded as strict UTF-8, so a delta that splits a character fails here."""
    proc = subprocess.run([str(build / "twostep-translate"), str(art), "--stream", *map(str, args)], input="".join(
        line + "\n" for line in lines).encode(), capture_output=True, timeout=900)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return [json.loads(line.decode("utf-8")) for line in proc.stdout.splitlines()]
