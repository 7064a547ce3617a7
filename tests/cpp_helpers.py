"""The C++ embedding's paths and its example program, for the tests that build and run it."""

from __future__ import annotations

import subprocess
from pathlib import Path

CPP = Path(__file__).resolve().parents[1] / "cpp"


def translate_cpp(build: Path, art: Path, lines: list[str], *args) -> subprocess.CompletedProcess:
    """cpp/'s example program: one sentence a line in, one translation a line out."""
    return subprocess.run([str(build / "twostep-translate"), str(art), *map(str, args)], input="".join(
        line + "\n" for line in lines), capture_output=True, text=True, timeout=900)
