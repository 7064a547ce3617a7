"""A twostep job that kills itself (SIGKILL) just before its Nth filesystem step, so that the fault-injection
tests crash it between any two steps of publishing an output without relying on timing.

    python crash_child.py N cli ARGS...     `twostep ARGS...`
    python crash_child.py N copy SRC OUT    SRC's files written as the artifact OUT, replacing one (force)

The steps, counted from 1: each file that `copy` writes, then each rename, replace, unlink and rmdir from the
start of `twostep.files.publish` on (the old output renamed aside, the new one renamed in, the old one removed
file by file, the lock file removed). A job with fewer than N steps ends as it would without this.
"""

from __future__ import annotations

import os
import runpy
import shutil
import signal
import sys
from pathlib import Path

import twostep.files as files

kill_at, steps = 0, 0


def step() -> None:
    global steps
    steps += 1
    if steps == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


def counted(fn):
    def call(*args, **kwargs):
        step()
        return fn(*args, **kwargs)
    return call


def publish(*args, publish=files.publish, **kwargs):
    for name in ("rename", "replace", "unlink", "rmdir"):  # shutil.rmtree and pathlib call these too
        setattr(os, name, counted(getattr(os, name)))
    return publish(*args, **kwargs)


def copy(src: Path, out: Path) -> None:
    from twostep.artifact.store import ARTIFACT

    with files.output_directory(out, ARTIFACT, force=True) as tmp:
        for file in sorted(src.iterdir()):
            step()
            shutil.copyfile(file, tmp / file.name)


if __name__ == "__main__":
    kill_at, job, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    files.publish = publish
    if job == "copy":
        copy(Path(args[0]), Path(args[1]))
    else:
        sys.argv = ["twostep", *args]
        runpy.run_module("twostep.cli", run_name="__main__")
