"""Writing outputs without ever destroying what twostep did not write.

An output directory is built in a temporary sibling (`.NAME.twostep-tmp-*`) and renamed into place only when
it is complete. An existing directory is replaced only when it is twostep's own earlier output of the same
kind and the caller passed `force`: the old one is renamed aside (`.NAME.twostep-old-*`), the new one renamed
in, then the old one removed; the next run that writes NAME repairs a crash between any two of those steps.
A lock file beside the output (`.NAME.twostep-lock`, removed when done) keeps two processes from writing
the same output at once. Every OSError becomes one `OutputError` naming the path.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twostep.errors import OutputError

TMP, OLD, LOCK = "twostep-tmp", "twostep-old", "twostep-lock"


@dataclass(frozen=True)
class OutputKind:
    """What twostep writes into an output directory, so that it recognises its own earlier output."""

    noun: str  # "artifact", "checkpoint"
    marker: str  # the file that makes a directory one of these; removed first when an old one is deleted
    owned: Callable[[Path], set[str] | None]  # the entries of `path` that twostep wrote; None: not this kind


def sibling(out_dir: Path, tag: str) -> Path:
    return out_dir.parent / f".{out_dir.name}.{tag}"


def describe(exc: OSError, path: Path) -> str:
    where = f"{exc.filename}: " if exc.filename is not None and str(exc.filename) != str(path) else ""
    return f"cannot write {path}: {where}{exc.strerror or exc}"


@contextmanager
def os_errors(path: Path) -> Iterator[None]:
    """OSError (permissions, read-only filesystem, disk full, a file where a directory should be) as one
    OutputError; the work inside has already cleaned up after itself."""
    try:
        yield
    except OSError as exc:
        raise OutputError(describe(exc, path)) from None


def check_target(out_dir: Path, kind: OutputKind, force: bool) -> None:
    """Refuse an output path that holds anything but twostep's own earlier output, and that without `force`."""
    if out_dir.is_symlink():
        raise OutputError(f"{out_dir} is a symbolic link; give the directory it points to, or another --out")
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise OutputError(f"{out_dir} exists and is not a directory; choose another --out")
    entries = set(os.listdir(out_dir))
    if not entries:
        return  # an empty directory holds nothing to lose
    owned = kind.owned(out_dir)
    if owned is None:
        shown = ", ".join(sorted(entries)[:3]) + (", ..." if len(entries) > 3 else "")
        raise OutputError(f"{out_dir} exists and is not a twostep {kind.noun} (it holds {shown}); twostep never "
                          "replaces a directory it did not write: choose another --out")
    strays = sorted(entries - owned)
    if strays:
        raise OutputError(f"{out_dir} is a twostep {kind.noun} but also holds files twostep did not write "
                          f"({', '.join(strays[:5])}); move them out first, or choose another --out")
    if not force:
        raise OutputError(f"{out_dir} already holds a twostep {kind.noun}; pass --force to replace it (the old "
                          "one stays whole until the new one is complete)")


@contextmanager
def locked(out_dir: Path) -> Iterator[None]:
    """An exclusive lock on writing `out_dir`, held by this process until the block ends."""
    path = sibling(out_dir, LOCK)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise OutputError(f"{out_dir}: another twostep process{f' (pid {holder})' if holder else ''} is "
                              "writing it now; wait for it to finish") from None
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        opened = os.fstat(fd)
        if current is not None and (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino):
            break
        os.close(fd)  # the previous holder removed this lock file as we opened it: take a fresh one
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        try:
            os.unlink(path)
        finally:
            os.close(fd)


def remove_tree(path: Path, kind: OutputKind) -> None:
    """Remove an old output of ours: its marker first, so that a crash halfway never leaves something that
    looks whole."""
    try:
        (path / kind.marker).unlink()
    except FileNotFoundError:
        pass
    shutil.rmtree(path)


def recover(out_dir: Path, kind: OutputKind) -> None:
    """Repair what a killed run left beside `out_dir`: put a whole old output back where a crash left none,
    and remove temporary and old directories. Called with the lock held, so no live run owns them."""
    parent = out_dir.parent
    olds = sorted(parent.glob(f".{out_dir.name}.{OLD}-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in olds:
        if not out_dir.exists() and not out_dir.is_symlink() and kind.owned(old) is not None:
            os.rename(old, out_dir)
        else:
            remove_tree(old, kind)
    for tmp in parent.glob(f".{out_dir.name}.{TMP}-*"):
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp)
        else:
            tmp.unlink()


def sync_tree(path: Path) -> None:
    """fsync every file under `path` and the directories themselves, so that a rename publishes whole files."""
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        sync_dir(Path(root))


def sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: Path, out_dir: Path, kind: OutputKind) -> None:
    """Move the finished `tmp` to `out_dir`; an existing (checked) output is renamed aside first and removed
    last, so that a crash at any point leaves one whole output (repaired into place by `recover`)."""
    sync_tree(tmp)
    tmp.chmod(0o755)
    if out_dir.exists() and os.listdir(out_dir):
        old = sibling(out_dir, f"{OLD}-{secrets.token_hex(4)}")
        os.rename(out_dir, old)
        os.rename(tmp, out_dir)
        sync_dir(out_dir.parent)
        remove_tree(old, kind)
    else:
        os.rename(tmp, out_dir)  # onto nothing, or onto an empty directory
        sync_dir(out_dir.parent)


def missing_parents(path: Path) -> list[Path]:
    """The ancestors of `path` that do not exist yet, deepest first."""
    out = []
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise OutputError(f"cannot write {path}: {parent} is a file, not a directory")
            break
        out.append(parent)
    return out


@contextmanager
def output_directory(out_dir: Path | str, kind: OutputKind, force: bool = False) -> Iterator[Path]:
    """Yield an empty temporary directory to fill; on success it becomes `out_dir`. Checks `out_dir` before
    the work starts (so a long job fails fast) and again before publishing. On any error nothing is left:
    not the temporary directory, not the parents this call created, and `out_dir` is as it was."""
    out_dir = Path(os.path.abspath(out_dir))
    with os_errors(out_dir):
        check_target(out_dir, kind, force)
        created = missing_parents(out_dir)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            with locked(out_dir):
                recover(out_dir, kind)
                check_target(out_dir, kind, force)
                tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.{TMP}-", dir=out_dir.parent))
                try:
                    yield tmp
                    check_target(out_dir, kind, force)  # the path may have changed while the work ran
                    publish(tmp, out_dir, kind)
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
        except BaseException:
            for parent in created:
                try:
                    parent.rmdir()
                except OSError:
                    break
            raise


def write_file_atomic(path: Path, data: bytes) -> None:
    """Write `path` through a temporary file in the same directory and a rename: readers see the old file
    or the whole new one, never a part."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{TMP}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


__all__ = ["OutputKind", "output_directory", "os_errors", "write_file_atomic"]


def read_json(file: Path, error: type[Exception]) -> Any:
    """A JSON file's value; a file that cannot be read or is not JSON raises `error` naming the file."""
    try:
        return json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise error(f"{file}: not valid JSON ({str(exc)[:200]})") from None
    except OSError as exc:
        raise error(f"{file}: cannot read it ({exc.strerror})") from None
