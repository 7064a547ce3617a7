"""The translated files of LibreTranslate's POST /translate_file, kept for GET /download_file/NAME: each under a
name the server makes (a random UUID, then the upload's name made safe, as LibreTranslate's), in one folder, and
removed `ttl_s` after it was written (LibreTranslate keeps them 30 minutes): the folder is swept on every store and
download, and removed when the server exits. A requested name that is not one the server makes (a path, `../x`,
a backslash) is refused before the folder is looked at."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from twostep.errors import BadInput

NAME = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.[A-Za-z0-9_.-]+")


class Downloads:
    """The folder of translated files (`folder`: None, a new temporary one, made at the first store)."""

    def __init__(self, folder: str | None, ttl_s: float):
        self.given, self.ttl_s, self.made = folder, ttl_s, None

    @property
    def folder(self) -> Path:
        if self.given is not None:
            Path(self.given).mkdir(parents=True, exist_ok=True)
            return Path(self.given)
        if self.made is None:
            self.made = Path(tempfile.mkdtemp(prefix="twostep-files-"))
            atexit.register(shutil.rmtree, self.made, True)
        return self.made

    def store(self, data: bytes, filename: str, target: str) -> str:
        """Keep a translated file; its download name: a UUID, then the upload's name (only letters, digits and
        . _ -) with the target's code before the suffix (report.docx -> UUID.report_fr.docx)."""
        self.sweep()
        stem, suffix = os.path.splitext(os.path.basename(filename.replace("\\", "/")))
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{stem}_{target}").strip("._") or "file"
        name = f"{uuid.uuid4()}.{safe}{re.sub(r'[^A-Za-z0-9.]', '', suffix)}"
        (self.folder / name).write_bytes(data)
        return name

    def path(self, name: str) -> Path | None:
        """The file of a download name (None: gone, or never made); BadInput for a name the server does not make."""
        if not NAME.fullmatch(name):
            raise BadInput("Invalid filename")
        self.sweep()
        path = self.folder / name
        return path if path.is_file() else None

    def sweep(self) -> None:
        """Remove the files older than ttl_s."""
        if self.given is None and self.made is None:
            return
        oldest = time.time() - self.ttl_s
        for path in self.folder.iterdir():
            try:
                if path.is_file() and NAME.fullmatch(path.name) and path.stat().st_mtime < oldest:
                    path.unlink()
            except FileNotFoundError:  # removed meanwhile, by a sweep of another request
                pass


def download_name(name: str) -> str:
    """The name a download is saved as: without the UUID (LibreTranslate's)."""
    return name.split(".", 1)[1]
