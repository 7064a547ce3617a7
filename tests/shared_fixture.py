"""Expensive session fixtures built once per test run, under pytest-xdist too (its documented recipe): with
several workers, the first that needs one builds it into a folder all workers share, under a file lock, and
the others take what it left there."""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from filelock import FileLock

T = TypeVar("T")


def built_once(tmp_path_factory, name: str, build: Callable[[Path], T]) -> T:
    """`build(folder)` for a fresh folder named after `name`. A serial run builds it in pytest's temporary
    directory as any fixture would. Under xdist (PYTEST_XDIST_WORKER set), the folder is `name` beside the
    workers' own, and the first worker to ask builds it and pickles its result there; the others wait on the
    lock and unpickle it (Paths, and dataclasses of them and of plain values: cheap). A build that failed left
    no result: the next worker to ask builds it again, and fails the same way."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent  # pytest-N/, which holds each worker's popen-gwK/
    folder, result = shared / name, shared / f"{name}.pickle"
    with FileLock(shared / f"{name}.lock"):
        if result.is_file():
            return pickle.loads(result.read_bytes())
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        value = build(folder)
        result.write_bytes(pickle.dumps(value))
        return value
