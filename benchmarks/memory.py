"""The memory a command takes: the peak, over its run, of the resident memory of its whole process tree (the
command and every process it starts, workers included), sampled from /proc (Linux) every `interval` seconds.

    python -m benchmarks.memory [--interval 0.05] [--limit-gib G] [--json OUT] -- COMMAND ...

Two sums are kept: RSS (every resident page of every process, memory-mapped files included) and PSS (the same,
each page shared by several mappings counted once in all: the share of the machine's memory the tree holds).
A file mapped by two processes of the tree, or twice by one, is counted twice by RSS and once by PSS; PSS is the
figure the docs state. A sample is a read of each process's smaps_rollup, so a peak shorter than the interval
may be missed: the interval is short beside any phase that holds memory (a session's load, a graph's trace).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

GIB = 1 << 30


@dataclass
class Peak:
    returncode: int
    seconds: float
    pss: int  # bytes
    rss: int
    processes: int  # the most processes seen at once
    stopped: bool = False  # killed by measure when its PSS passed the limit

    def describe(self) -> str:
        return (f"peak PSS {self.pss / GIB:.2f} GiB, RSS {self.rss / GIB:.2f} GiB, {self.processes} process(es), "
                f"{self.seconds:.1f} s, exit status {self.returncode}"
                + (" (killed: past the memory limit)" if self.stopped else ""))


def children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:  # the process ended between two reads
        pass
    return out


def tree(pid: int) -> list[int]:
    pids, i = [pid], 0
    while i < len(pids):
        pids += children(pids[i])
        i += 1
    return pids


def resident(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of one process, in bytes; (0, 0) once it is gone."""
    pss = rss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                elif line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return pss, rss


class Sampler:
    """Samples the tree under `pid` in a thread until stopped; `pss`, `rss` and `processes` hold the largest
    sums seen. A tree whose PSS passes `limit` bytes is killed, every process of it (`stopped`): a conversion
    that would take more than the machine fails there, not by the kernel's OOM killer choosing a victim."""

    def __init__(self, pid: int, interval: float = 0.05, limit: int | None = None):
        self.pid, self.interval, self.limit = pid, interval, limit
        self.pss = self.rss = self.processes = 0
        self.stopped = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        pids = tree(self.pid)
        sums = [resident(p) for p in pids]
        if self.limit and sum(s[0] for s in sums) > self.limit:
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            self.stopped = True
        self.pss = max(self.pss, sum(s[0] for s in sums))
        self.rss = max(self.rss, sum(s[1] for s in sums))
        self.processes = max(self.processes, len(pids))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def measure(command: list[str], interval: float = 0.05, env: dict | None = None, cwd: Path | None = None,
            stdout=None, stderr=None, timeout: float | None = None, limit: int | None = None,
            started=None) -> Peak:
    """Run `command` to its end (or to `limit` bytes of PSS: Sampler), sampling its process tree; its peak.
    `started(process)`, if given, runs in a thread of its own once the process has started (a server's client,
    which stops it)."""
    began = time.perf_counter()
    process = subprocess.Popen(command, env=env, cwd=cwd, stdout=stdout, stderr=stderr)
    if started is not None:
        threading.Thread(target=started, args=(process,), daemon=True).start()
    with Sampler(process.pid, interval, limit) as sampler:
        try:
            process.wait(timeout)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    return Peak(process.returncode, time.perf_counter() - began, sampler.pss, sampler.rss, sampler.processes,
                sampler.stopped)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--limit-gib", type=float, help="kill the command's tree past this PSS")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")
    peak = measure(command, args.interval, limit=int(args.limit_gib * GIB) if args.limit_gib else None)
    print(peak.describe(), file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(asdict(peak), indent=2) + "\n")
    return peak.returncode


if __name__ == "__main__":
    sys.exit(main())
