"""Writing a file so that a crash leaves either the old content or the new one, never a torn file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes, *, owner: str = "") -> None:
    """Replace ``path`` with ``data`` atomically: temp file in the same folder, fsync, ``os.replace``.

    Creates missing parent folders. On any error the temp file is removed and ``path`` is untouched;
    a process killed mid-write leaves ``.<name>.<owner>.<random>.tmp`` (``owner`` lets a later sweep
    tell whose it was).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{path.name}.{owner}." if owner else f".{path.name}."
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
