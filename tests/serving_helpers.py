"""A real `twostep serve` process on a free loopback port, for the serving tests: `server(...)` (`serving(...)`
for a command of one's own that serves as `twostep serve` does), `post(...)`, and `refused_start(...)` for one
that must not start."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import httpx
import pytest


@contextmanager
def server(art, *args, ready_s: float = 120, env: dict[str, str] | None = None, module: str = "twostep.cli"):
    """`twostep serve ART --port 0 ...` in its own process (`env`: added to the environment; `module`: the one
    run with -m, which runs twostep's CLI); yields (base URL, process), the process's output lines so far in
    `process.log` (all of them once the block has ended). Stopped with SIGTERM if still running."""
    with serving([sys.executable, "-m", module, "serve", str(art), "--host", "127.0.0.1", "--port", "0",
                  *map(str, args)], ready_s=ready_s, env=env) as served:
        yield served


@contextmanager
def serving(command: list[str], ready_s: float = 120, env: dict[str, str] | None = None):
    """`server` for a command of one's own that serves on 127.0.0.1 as `twostep serve` does (uvicorn's "Uvicorn
    running on URL" once it listens)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    lines: list[str] = []
    url = None
    deadline = time.monotonic() + ready_s
    while url is None:
        line = proc.stdout.readline()
        if not line:
            proc.wait(10)
            pytest.fail(f"the server exited before serving ({proc.returncode}):\n{''.join(lines)}")
        lines.append(line)
        found = re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", line)
        url = found and found.group(1)
        assert time.monotonic() < deadline, "".join(lines)
    drain = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # keep the pipe flowing
    drain.start()
    proc.log = lines
    try:
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        drain.join(10)  # after the block, `process.log` holds every line


def refused_start(art, *args, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """`twostep serve ART --port 0 ...` that must stop before serving: its result; a test failure, not a hang,
    if it is still running after `timeout_s` (it started)."""
    try:
        return subprocess.run([sys.executable, "-m", "twostep.cli", "serve", str(art), "--port", "0",
                               *map(str, args)], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"twostep serve {' '.join(map(str, args))} started instead of refusing")


def post(url, body, **kw):
    return httpx.post(f"{url}/v1/translate", json=body, timeout=60, **kw)
