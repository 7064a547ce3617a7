"""Writing directories atomically: a temporary sibling renamed into place only when everything in it is done."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_directory(out_dir: Path) -> Iterator[Path]:
    """Yield a temporary directory beside `out_dir`; on success it replaces `out_dir`, on any error it is
    removed and `out_dir` is left as it was."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        yield tmp
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.chmod(0o755)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
