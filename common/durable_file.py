"""Small files replaced atomically and durably (checkpoints, markers, dumps; the Raft term and
vote are overwritten in place instead: ``dledger.storage.hard_state``).

``atomic_write`` leaves ``path`` holding either the old or the new content, never
a mix, even across a power loss, and the new content is on disk when it returns:

    write temp file in the same directory ─▶ fsync it ─▶ os.replace onto path
                                                        ─▶ fsync the directory
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write", "fsync_directory", "read_or_none"]


def fsync_directory(directory: Path) -> None:
    """fsync a directory so that created, renamed or deleted entries in it are durable.

    Raises OSError. Thread-safe (uses its own descriptor).
    """
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    Any caller; concurrent writers of the same path are safe (each uses its own
    temp file; the last replace wins). Raises OSError; on failure the previous
    content of ``path`` is untouched and the temp file is removed.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_directory(path.parent)


def read_or_none(path: Path) -> bytes | None:
    """The content of ``path``, or None if it does not exist. Raises other OSErrors."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None
