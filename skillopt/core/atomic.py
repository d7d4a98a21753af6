"""Writing a file so that a crash leaves either the old content or the new one, never a torn file."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from skillopt.core.errors import StorageError, storage_error


@functools.cache
def process_umask() -> int:
    """The process's umask, read once: from ``/proc`` where it can be read without changing it (setting it
    to read it back would race with other threads creating files)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes, *, owner: str = "") -> None:
    """Replace ``path`` with ``data`` atomically: temp file in the same folder, fsync, ``os.replace``.

    The file gets the mode a plain ``open`` would give it (0666 less the umask; the temp file alone would
    be private). Creates missing parent folders. On any error the temp file is removed and ``path`` is
    untouched; a process killed mid-write leaves ``.<name>.<owner>.<random>.tmp`` (``owner`` lets a later
    sweep tell whose it was). A system refusal (read-only place, full disk, no permission) is a
    ``StorageError`` naming ``path``.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        prefix = f".{path.name}.{owner}." if owner else f".{path.name}."
        handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    except StorageError:
        raise
    except OSError as error:
        raise storage_error(path, error) from None
    try:
        with os.fdopen(handle, "wb") as file:
            os.fchmod(file.fileno(), 0o666 & ~process_umask())
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp_name, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        if isinstance(error, OSError) and not isinstance(error, StorageError):
            raise storage_error(path, error) from None
        raise


def check_writable(folder: Path, setting: str) -> None:
    """Create ``folder`` if needed and prove a file can be written in it, before any work that would be lost.

    A ``StorageError`` names the folder and the setting that chose it, e.g. ``run.cache_dir``.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".skillopt-write-check.", suffix=".tmp")
        try:
            os.write(handle, b"ok")
            os.fsync(handle)
        finally:
            os.close(handle)
            os.unlink(probe)
    except OSError as error:
        raise StorageError(f"cannot write to {folder} ({setting}): {error.strerror or error}") from None


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if missing) while the block runs: one process at a
    time, across processes."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
