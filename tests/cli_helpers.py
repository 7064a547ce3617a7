"""The CLI as a user runs it, for every test that drives it: a real process, its exit code and its one-line
errors; and what a finished run must not leave beside its output."""

from __future__ import annotations

import subprocess
import sys


def twostep(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "twostep.cli", *map(str, args)], input=stdin,
                          capture_output=True, text=True, timeout=600)


def assert_user_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr


def leftovers(parent):
    """Temporary, aside and lock entries that a finished run must not leave."""
    return sorted(p.name for p in parent.iterdir() if ".twostep-" in p.name)
